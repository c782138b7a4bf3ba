package cdc

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Kinds of error that Run, Preflight, Setup and QueryLag return. Test them
// with errors.Is; the message itself says what to do.
var (
	// ErrConfig: a Config field is invalid (the message names it).
	ErrConfig = errors.New("invalid cdc configuration")
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = errors.New("wal_level is not logical")
	// ErrReplicationPrivilege: the role may not use logical replication.
	ErrReplicationPrivilege = errors.New("role lacks the REPLICATION attribute")
	// ErrPrivilege: the role lacks a grant it needs (the message names it).
	ErrPrivilege = errors.New("insufficient privilege")
	// ErrOutboxTable: the outbox table does not exist or is not a table.
	ErrOutboxTable = errors.New("outbox table missing")
	// ErrOutboxColumn: a mapped outbox column is missing or has a type the
	// relay cannot read (the message names the field and the column).
	ErrOutboxColumn = errors.New("outbox column missing or mistyped")
	// ErrPublication: the publication exists but cannot serve the outbox
	// table, or it is missing and cannot be created.
	ErrPublication = errors.New("publication unusable")
	// ErrSlotLost: the slot is gone while a checkpoint exists, or PostgreSQL
	// invalidated it (wal_status 'lost'). Events may have been skipped.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrSlotUnusable: a slot of that name exists but is not a pgoutput
	// logical slot of this database.
	ErrSlotUnusable = errors.New("replication slot unusable")
	// ErrSlotNotFound: QueryLag found no slot of that name.
	ErrSlotNotFound = errors.New("replication slot not found")
	// ErrProtocol: the replication stream broke a rule of the protocol (an
	// insert for a relation that was never described, a commit without a
	// begin). The session is restarted; it is never guessed around.
	ErrProtocol = errors.New("replication protocol violation")
	// ErrStop is for sinks: a HandleBatch error that wraps ErrStop makes Run
	// return it instead of reconnecting and replaying the batch.
	ErrStop = errors.New("sink asked the stream to stop")
)

// kindError is an error with a kind for errors.Is and a message a person can
// act on.
type kindError struct {
	kind  error
	msg   string
	cause error
}

func (e *kindError) Error() string { return e.msg }

func (e *kindError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: "cdc: " + fmt.Sprintf(format, args...)}
}

func wrapf(kind, cause error, format string, args ...any) error {
	return &kindError{kind: kind, msg: "cdc: " + fmt.Sprintf(format, args...) + ": " + cause.Error(), cause: cause}
}

// fatal reports whether err ends Run instead of a reconnect.
func fatal(err error) bool {
	for _, k := range []error{ErrConfig, ErrWALLevel, ErrReplicationPrivilege, ErrPrivilege,
		ErrOutboxTable, ErrOutboxColumn, ErrPublication, ErrSlotLost, ErrSlotUnusable, ErrStop} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// redactor removes a password from error messages and log text. Every error
// Run, Preflight, Setup and QueryLag return has been through it.
type redactor struct{ secrets []string }

func newRedactor(password string) redactor {
	if password == "" {
		return redactor{}
	}
	s := []string{password}
	for _, esc := range []string{url.QueryEscape(password), url.PathEscape(password)} {
		if esc != password {
			s = append(s, esc)
		}
	}
	return redactor{secrets: s}
}

// redactFunc is r.string for a log handler, or nil when there is nothing to
// hide.
func (r redactor) redactFunc() func(string) string {
	if len(r.secrets) == 0 {
		return nil
	}
	return r.string
}

func (r redactor) string(s string) string {
	for _, p := range r.secrets {
		s = strings.ReplaceAll(s, p, "xxxxx")
	}
	return s
}

// err returns err with the password removed from its message; errors.Is and
// errors.As still see the original chain.
func (r redactor) err(err error) error {
	if err == nil || len(r.secrets) == 0 {
		return err
	}
	msg := err.Error()
	clean := r.string(msg)
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
