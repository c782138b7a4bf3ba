package main

import "github.com/compensa/compensa/internal/dbconn"

func redactAll(s string, secrets []string) string { return dbconn.RedactAll(s, secrets) }
