package cdc

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/outbox"
)

// Defaults, shared with the CLI.
const (
	DefaultSlot               = "relay_outbox"
	DefaultPublication        = "relay_outbox_pub"
	DefaultStatusInterval     = 10 * time.Second
	DefaultHeartbeatInterval  = 10 * time.Second
	DefaultMaxBatchEvents     = 5000
	DefaultMaxBatchBytes      = 64 << 20
	DefaultRetentionInterval  = time.Minute
	DefaultRetentionBatchSize = 1000
	DefaultLeaderPollInterval = time.Second
	DefaultMaxReconnectWait   = 2 * time.Second
	DefaultShutdownTimeout    = 10 * time.Second

	// HeartbeatPrefix is the prefix of the transactional logical messages the
	// leader emits (pg_logical_emit_message) to keep the slot advancing.
	HeartbeatPrefix = "compensa_heartbeat"
)

// Config configures a Stream. The zero value of every field but DatabaseURL
// means its default; see WithDefaults.
type Config struct {
	// DatabaseURL is an ordinary PostgreSQL URL or keyword/value DSN. The
	// stream adds replication=database for its replication connection; the
	// DSN's sslmode and other settings are honoured on every connection.
	DatabaseURL string
	// Slot is the logical replication slot (default "relay_outbox"): lower
	// case letters, digits and underscores only, as PostgreSQL requires.
	Slot string
	// Publication is the publication the slot decodes (default
	// "relay_outbox_pub"). Created when missing: publish = 'insert', the
	// outbox table only.
	Publication string
	// Table is the outbox table (default "outbox", found on the search path).
	Table outbox.TableName
	// Columns maps our field names to the table's columns; fields left out
	// take their default names (outbox.DefaultColumns).
	Columns outbox.ColumnMap
	// StatusInterval is how often the stream reports its position to
	// PostgreSQL (default 10s); it also replies at once when asked.
	StatusInterval time.Duration
	// HeartbeatInterval is how often the leader emits a heartbeat (default
	// 10s), so that the slot advances while the outbox is idle.
	HeartbeatInterval time.Duration
	// MessagePrefix is the prefix of the logical decoding messages
	// (pg_logical_emit_message) that are outbox events (default "outbox",
	// outbox.DefaultMessagePrefix; PostgreSQL 14 or later). A transactional
	// one is an event of its transaction, in order with the transaction's
	// outbox rows; a non-transactional one is refused (a poison event, see
	// messages.go). Messages with other prefixes are ignored.
	MessagePrefix string
	// RecreateSlot lets Run re-create a slot that is missing or invalidated
	// instead of stopping with ErrSlotLost. Events committed while the slot
	// was gone may be skipped: outbox rows still in the table are re-read
	// (the unique indexes absorb the duplicates), deleted ones are lost.
	RecreateSlot bool
	// OnSlotLost says what Run does when the slot is missing while a
	// checkpoint exists, or invalidated: SlotLostStop (the default) returns
	// ErrSlotLost; SlotLostResync creates a new slot and, before streaming
	// from it, re-reads the outbox rows created since the last checkpoint's
	// time minus ResyncMargin (see resync.go).
	OnSlotLost string
	// ResyncMargin is how far before the last checkpoint's time a resync
	// starts reading (default 10m): longer than the longest producer
	// transaction, whose rows carry its start time.
	ResyncMargin time.Duration
	// MaxBatchEvents bounds the events in one Batch (default 5000). A larger
	// transaction is handed over in Partial batches.
	MaxBatchEvents int
	// MaxBatchBytes bounds the payload bytes in one Batch (default 64 MB), so
	// that large payloads cannot make a batch (or the sink's statement) grow
	// without limit. A batch always holds at least one event.
	MaxBatchBytes int
	// Retention, when positive, deletes outbox rows whose created_at is older
	// than Retention and that the sink has already handled (see retention.go
	// for how "already handled" is proven). Zero keeps every row.
	Retention time.Duration
	// RetentionInterval is how often retention runs (default 1m).
	RetentionInterval time.Duration
	// RetentionBatchSize is how many rows one DELETE removes (default 1000).
	RetentionBatchSize int
	// LoadCheckpoint returns the sink's checkpoint for Slot (false when there
	// is none). The default reads relay_checkpoints.
	LoadCheckpoint func(ctx context.Context) (pglogrepl.LSN, bool, error)
	// Logger receives the stream's logs (default: discarded).
	Logger *slog.Logger
	// Metrics observes batches, lag, leadership and reconnects (optional).
	Metrics Metrics
	// LeaderPollInterval is how often a waiting replica tries to take the
	// leadership, and how often the leader checks it still holds it
	// (default 1s).
	LeaderPollInterval time.Duration
	// MaxReconnectWait caps the backoff between reconnects (default 2s: a
	// session costs one connection attempt, and the stream resumes within
	// that much of the database coming back).
	MaxReconnectWait time.Duration
	// ShutdownTimeout bounds how long a stop waits for the batch the sink is
	// handling (default 10s); after it, the sink's context is cancelled.
	ShutdownTimeout time.Duration
	// StallAfter is how long committed work may wait behind the
	// acknowledged position, or the stream stay down, before Health reports
	// the stream stalled (default DefaultStallAfter).
	StallAfter time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Slot = cmp.Or(c.Slot, DefaultSlot)
	c.Publication = cmp.Or(c.Publication, DefaultPublication)
	c.Table = cmp.Or(c.Table, outbox.TableName{Name: outbox.DefaultTable})
	cols := outbox.DefaultColumns()
	maps.Copy(cols, c.Columns)
	c.Columns = cols
	c.StatusInterval = cmp.Or(c.StatusInterval, DefaultStatusInterval)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.MessagePrefix = cmp.Or(c.MessagePrefix, outbox.DefaultMessagePrefix)
	c.MaxBatchEvents = cmp.Or(c.MaxBatchEvents, DefaultMaxBatchEvents)
	c.MaxBatchBytes = cmp.Or(c.MaxBatchBytes, DefaultMaxBatchBytes)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, DefaultRetentionInterval)
	c.RetentionBatchSize = cmp.Or(c.RetentionBatchSize, DefaultRetentionBatchSize)
	c.LeaderPollInterval = cmp.Or(c.LeaderPollInterval, DefaultLeaderPollInterval)
	c.MaxReconnectWait = cmp.Or(c.MaxReconnectWait, DefaultMaxReconnectWait)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.StallAfter = cmp.Or(c.StallAfter, DefaultStallAfter)
	c.OnSlotLost = cmp.Or(c.OnSlotLost, SlotLostStop)
	c.ResyncMargin = cmp.Or(c.ResyncMargin, DefaultResyncMargin)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NopMetrics{}
	}
	return c
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// validate rejects nonsense with a message that names the field. needURL is
// false for Setup and Preflight, which are handed a connection.
func (c *Config) validate(needURL bool) error {
	if needURL {
		if strings.TrimSpace(c.DatabaseURL) == "" {
			return errorf(ErrConfig, "Config.DatabaseURL is empty: pass a PostgreSQL URL such as postgres://user:password@host:5432/db")
		}
		if _, err := pgconn.ParseConfig(c.DatabaseURL); err != nil {
			// pgconn's message quotes the DSN; say only what is wrong with it.
			return errorf(ErrConfig, "Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value DSN")
		}
	}
	if !slotName.MatchString(c.Slot) {
		return errorf(ErrConfig, "Config.Slot %q: a replication slot name may contain only lower-case letters, digits and underscores, at most 63 of them", c.Slot)
	}
	switch {
	case c.MessagePrefix == HeartbeatPrefix:
		return errorf(ErrConfig, "Config.MessagePrefix %q is the relay's own heartbeat prefix: choose another", c.MessagePrefix)
	case strings.ContainsRune(c.MessagePrefix, 0):
		return errorf(ErrConfig, "Config.MessagePrefix contains a NUL byte")
	}
	if err := checkIdent("Config.Publication", c.Publication); err != nil {
		return err
	}
	if err := checkIdent("Config.Table (name)", c.Table.Name); err != nil {
		return err
	}
	if c.Table.Schema != "" {
		if err := checkIdent("Config.Table (schema)", c.Table.Schema); err != nil {
			return err
		}
	}
	known := map[string]bool{}
	for _, f := range outbox.Fields {
		known[f] = true
	}
	for _, f := range slices.Sorted(maps.Keys(c.Columns)) {
		if !known[f] {
			return errorf(ErrConfig, "Config.Columns: unknown field %q (known: %s)", f, strings.Join(outbox.Fields, ", "))
		}
		if err := checkIdent("Config.Columns["+f+"]", c.Columns[f]); err != nil {
			return err
		}
	}
	for name, d := range map[string]time.Duration{
		"StatusInterval": c.StatusInterval, "HeartbeatInterval": c.HeartbeatInterval,
		"RetentionInterval": c.RetentionInterval, "LeaderPollInterval": c.LeaderPollInterval,
		"MaxReconnectWait": c.MaxReconnectWait, "ShutdownTimeout": c.ShutdownTimeout, "StallAfter": c.StallAfter,
	} {
		if d < 0 {
			return errorf(ErrConfig, "Config.%s is negative (%s)", name, d)
		}
	}
	if c.OnSlotLost != SlotLostStop && c.OnSlotLost != SlotLostResync {
		return errorf(ErrConfig, "Config.OnSlotLost %q: want %q or %q", c.OnSlotLost, SlotLostStop, SlotLostResync)
	}
	if c.ResyncMargin < 0 {
		return errorf(ErrConfig, "Config.ResyncMargin is negative (%s)", c.ResyncMargin)
	}
	if c.Retention < 0 {
		return errorf(ErrConfig, "Config.Retention is negative (%s): use 0 to keep every outbox row", c.Retention)
	}
	if c.MaxBatchBytes < 1 {
		return errorf(ErrConfig, "Config.MaxBatchBytes is %d: want at least 1", c.MaxBatchBytes)
	}
	if c.MaxBatchEvents < 1 {
		return errorf(ErrConfig, "Config.MaxBatchEvents is %d: want at least 1", c.MaxBatchEvents)
	}
	if c.RetentionBatchSize < 1 {
		return errorf(ErrConfig, "Config.RetentionBatchSize is %d: want at least 1", c.RetentionBatchSize)
	}
	return nil
}

// checkIdent refuses identifiers PostgreSQL cannot hold; everything else is
// quoted wherever it is used.
func checkIdent(field, s string) error {
	switch {
	case s == "":
		return errorf(ErrConfig, "%s is empty", field)
	case strings.ContainsRune(s, 0):
		return errorf(ErrConfig, "%s contains a NUL byte", field)
	case len(s) > 63:
		return errorf(ErrConfig, "%s %q is longer than PostgreSQL's 63-byte identifier limit", field, s)
	}
	return nil
}
