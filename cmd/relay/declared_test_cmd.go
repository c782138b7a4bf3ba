package main

import "github.com/spf13/cobra"

func newSagasTestCmd() *cobra.Command { return &cobra.Command{Use: "test"} }
