//go:build !failpoint

package main

import "github.com/compensa/compensa/cdc"

// withFailpoint is a no-op without `-tags failpoint`: see failpoint.go.
func withFailpoint(sink cdc.Sink) cdc.Sink { return sink }
