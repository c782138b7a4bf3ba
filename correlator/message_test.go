package correlator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
)

// refusedMessage is a message event as the stream hands over one it
// refuses: Message and Poison set, the message as written in Raw.
func refusedMessage(content string, transactional bool, reason string) outbox.Event {
	ev := outbox.EventFromMessage([]byte(content))
	ev.Message = true
	if ev.ID == uuid.Nil {
		ev.ID = uuid.New()
		ev.RawID = ev.ID.String()
	}
	if ev.Poison != "" {
		reason += "; " + ev.Poison
	}
	ev.Poison = strings.TrimPrefix(reason, "; ")
	ev.Raw = map[string]any{"source": "message", "prefix": "outbox", "transactional": transactional,
		"message_lsn": "0/16B3748", "content": content}
	return ev
}

// A refused message is a dead letter that keeps the message as written; a
// re-drive decodes it again and a non-transactional one stays refused, even
// when its content would start a saga, since its transaction may have
// rolled back. A message decoded fine that the sagas refuse re-drives like a
// row.
func TestRefusedMessagesAreDeadLettersThatStayRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	good := fmt.Sprintf(`{"event_type": "research_brief.created", "payload": {"brief_id": %q}}`, uuid.New())
	nonTx := refusedMessage(good, false, "a non-transactional message is never an outbox event")
	noType := refusedMessage(`{"payload": {}}`, true, "")
	notJSON := refusedMessage(`not json`, true, "")
	if err := b.corr.HandleBatch(ctx, b.batch(nonTx, noType, notJSON)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 0 {
		t.Fatalf("refused messages started %d instances", n)
	}
	list, err := b.corr.ListDeadLetters(ctx, true, 10)
	if err != nil || len(list) != 3 {
		t.Fatalf("dead letters: %v, %v", list, err)
	}
	for _, d := range list {
		var raw map[string]any
		if err := json.Unmarshal(d.Raw, &raw); err != nil || raw["source"] != "message" || raw["content"] == nil {
			t.Errorf("dead letter %d keeps %s", d.ID, d.Raw)
		}
		_, err := b.corr.RetryDeadLetter(ctx, d.ID)
		if !errors.Is(err, correlator.ErrStillPoison) {
			t.Errorf("re-drive of %q: %v, want ErrStillPoison", d.Reason, err)
		}
		switch d.EventID {
		case nonTx.RawID:
			if !strings.Contains(d.Reason, "non-transactional") || d.EventType != "research_brief.created" {
				t.Errorf("non-transactional: %+v", d)
			}
			if !strings.Contains(err.Error(), "non-transactional") {
				t.Errorf("re-drive of the non-transactional message: %v", err)
			}
		case noType.RawID:
			if !strings.Contains(d.Reason, "no event_type") || !strings.Contains(err.Error(), "no event_type") {
				t.Errorf("no event_type: %+v, re-drive %v", d, err)
			}
		case notJSON.RawID:
			if !strings.Contains(d.Reason, "not JSON") {
				t.Errorf("not JSON: %+v", d)
			}
		default:
			t.Errorf("unexpected dead letter %+v", d)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 0 {
		t.Fatalf("re-driven refused messages started %d instances", n)
	}

	// Decoded fine, refused by the saga: a plain dead letter, re-driven
	// once the saga accepts it.
	ev := outbox.EventFromMessage([]byte(`{"id": "m-1", "event_type": "research_brief.created", "payload": {"brief_id": "nope"}}`))
	ev.Message = true
	if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
		t.Fatal(err)
	}
	list, err = b.corr.ListDeadLetters(ctx, true, 10)
	if err != nil || len(list) != 4 || list[0].EventID != "m-1" {
		t.Fatalf("dead letters: %v, %v", list, err)
	}
	if _, err := lenientCorrelator(t, b).RetryDeadLetter(ctx, list[0].ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, outbox.EventIDFromText("m-1")); n != 1 {
		t.Fatalf("the re-driven message started %d instances", n)
	}
}
