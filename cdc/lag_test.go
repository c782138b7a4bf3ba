package cdc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
)

func TestQueryLagReportsTheSlot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	if _, err := cdc.QueryLag(ctx, db.Pool, db.Slot); !errors.Is(err, cdc.ErrSlotNotFound) {
		t.Fatalf("QueryLag of a missing slot = %v, want ErrSlotNotFound", err)
	}
	sink := newSink(t, db.Pool)
	r := startStream(t, baseConfig(t, db), sink)
	writeEvents(t, db.Pool, 2, "x")
	waitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == 2 })
	waitFor(t, 10*time.Second, "an active slot", func() bool { _, active := slotState(t, db.Pool, db.Slot); return active })

	rep, err := cdc.QueryLag(ctx, db.Pool, db.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Slot != db.Slot || !rep.Active || rep.WALStatus != "reserved" || rep.LagBytes < 0 || rep.LagSeconds == nil || *rep.LagSeconds > 30 {
		t.Fatalf("report %+v", rep)
	}
	for _, s := range []string{rep.ConfirmedFlushLSN, rep.CurrentLSN} {
		if _, err := pglogrepl.ParseLSN(s); err != nil {
			t.Fatalf("LSN %q: %v", s, err)
		}
	}

	var buf bytes.Buffer
	if err := cdc.WriteLag(&buf, rep, true); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(buf.String(), "}\n") || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("JSON output is not one object per line: %q", buf.String())
	}
	var obj map[string]any
	if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
		t.Fatal(err)
	}
	want := []string{"active", "confirmed_flush_lsn", "current_lsn", "failover", "failover_ready", "lag_bytes", "lag_seconds", "slot", "synchronized_standby_slots", "wal_status"}
	if got := slices.Sorted(maps.Keys(obj)); !slices.Equal(got, want) {
		t.Fatalf("JSON keys %v, want %v", got, want)
	}
	buf.Reset()
	if err := cdc.WriteLag(&buf, cdc.LagReport{Slot: "s", Active: true, WALStatus: "reserved", LagBytes: 3 << 20, ConfirmedFlushLSN: "0/1", CurrentLSN: "0/2"}, false); err != nil {
		t.Fatal(err)
	}
	if line := buf.String(); !strings.Contains(line, "3.0 MiB (3145728 bytes)") || !strings.Contains(line, "slot s") || !strings.Contains(line, "wal_status=reserved") {
		t.Fatalf("human line %q", line)
	}

	lag := r.s.Lag()
	if !lag.Leader || lag.Slot != db.Slot || lag.FlushLSN == 0 || lag.LastCommit.IsZero() || lag.Seconds > 30 {
		t.Fatalf("Stream.Lag() = %+v", lag)
	}
	r.stop(t)
	if r.s.Lag().Leader {
		t.Fatal("a stopped stream reports itself leader")
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := cdc.HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
