package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The sinks' floor: what PostgreSQL's walsender itself gives a consumer at
// the sinks' offered rate. A bare reader (pglogrepl, pgoutput, nothing of
// the relay: no batching, no correlator, no sink) records for each outbox
// insert the time from its created_at to the moment the insert reaches the
// reader. A sink's commit-to-acknowledgement latency is judged against it.

// floorLatency runs the producer at perSec for window while a bare
// replication reader receives the inserts, and summarises created_at →
// receipt over the events after a warm-up one.
func (r *run) floorLatency(ctx context.Context, perSec int, window time.Duration) (LatencySummary, error) {
	e := r.env
	if err := e.reset(ctx); err != nil {
		return LatencySummary{}, err
	}
	slot := e.slotName(fmt.Sprintf("floor%d", perSec))
	if _, err := e.createSlot(ctx, slot, false); err != nil {
		return LatencySummary{}, err
	}
	defer e.pool.Exec(context.WithoutCancel(ctx), `SELECT pg_drop_replication_slot($1)`, slot) //nolint:errcheck // the cluster is thrown away

	count := int(int64(perSec) * int64(window) / int64(time.Second))
	prod, err := newProducer(ctx, e.url, newTimeline(count+1))
	if err != nil {
		return LatencySummary{}, err
	}
	defer prod.close()

	pc, err := pgconn.ParseConfig(e.url)
	if err != nil {
		return LatencySummary{}, fmt.Errorf("bench: floor reader: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return LatencySummary{}, fmt.Errorf("bench: floor reader: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + e.pub + "'"}}); err != nil {
		return LatencySummary{}, fmt.Errorf("bench: floor reader: %w", err)
	}

	var lat Latencies
	got := make(chan error, 1)
	rctx, cancel := context.WithTimeout(ctx, window+r.sz.timeout)
	defer cancel()
	warm := make(chan struct{})
	go func() { got <- readInserts(rctx, conn, count+1, warm, &lat) }()
	if err := prod.produce(ctx, 0, 1, 1); err != nil {
		return LatencySummary{}, err
	}
	select {
	case <-warm:
	case err := <-got:
		return LatencySummary{}, fmt.Errorf("bench: floor reader ended before the warm-up event: %v", err)
	case <-rctx.Done():
		return LatencySummary{}, fmt.Errorf("bench: the floor reader did not receive the warm-up event")
	}
	if err := prod.produce(ctx, 1, count, perSec); err != nil {
		return LatencySummary{}, err
	}
	if err := <-got; err != nil {
		return LatencySummary{}, err
	}
	return lat.Summary(), nil
}

// readInserts receives want outbox inserts, closing warm at the first and
// recording created_at → receipt for the others. It acknowledges what it
// read once a second, as any consumer must.
func readInserts(ctx context.Context, conn *pgconn.PgConn, want int, warm chan struct{}, lat *Latencies) error {
	createdAt := map[uint32]int{} // relation id → created_at's column
	var pos pglogrepl.LSN
	nextStatus := time.Now().Add(time.Second)
	for n := 0; n < want; {
		if time.Now().After(nextStatus) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
				return err
			}
			nextStatus = time.Now().Add(time.Second)
		}
		mctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(mctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("bench: floor reader after %d of %d inserts: %w", n, want, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		received := time.Now()
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return err
		}
		pos = max(pos, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			for i, c := range m.Columns {
				if c.Name == "created_at" {
					createdAt[m.RelationID] = i
				}
			}
		case *pglogrepl.InsertMessage:
			i, ok := createdAt[m.RelationID]
			if !ok || m.Tuple == nil || i >= len(m.Tuple.Columns) {
				continue
			}
			n++
			if n == 1 {
				close(warm)
				continue
			}
			t, err := time.Parse("2006-01-02 15:04:05.999999-07", string(m.Tuple.Columns[i].Data))
			if err != nil {
				// A zone whose offset has minutes.
				t, err = time.Parse("2006-01-02 15:04:05.999999-07:00", string(m.Tuple.Columns[i].Data))
			}
			if err != nil {
				return fmt.Errorf("bench: floor reader: created_at %q: %w", m.Tuple.Columns[i].Data, err)
			}
			lat.Add(received.Sub(t))
		}
	}
	return nil
}
