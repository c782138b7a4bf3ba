package briefs

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

func TestDefinitionShape(t *testing.T) {
	t.Parallel()
	d := Definition()
	if d.Name != "brief_enrichment" || d.Version != 1 || len(d.Triggers) != 1 || d.Triggers[0].EventType != "research_brief.created" {
		t.Fatalf("definition %s triggers %+v", d.Key(), d.Triggers)
	}
	want := []string{"claim_brief", "attach_sources", "score_brief", "publish_brief"}
	got := d.StepNames()
	if len(got) != len(want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	for i, s := range d.Steps {
		if got[i] != want[i] || s.Do == nil || s.Compensate == nil {
			t.Fatalf("step %d: %q, Do set %v, Compensate set %v", i, got[i], s.Do != nil, s.Compensate != nil)
		}
		p := s.CompensationRetry.WithDefaults(saga.DefaultCompensationRetry)
		if p.MaxAttempts != 5 || p.Base != 200*time.Millisecond || p.Max != 2*time.Second {
			t.Fatalf("step %s compensation policy %+v, want 5 attempts, 200ms..2s", s.Name, p)
		}
	}

	reg := saga.NewRegistry()
	if err := Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg); !errors.Is(err, saga.ErrConflict) {
		t.Fatalf("second Register: got %v, want ErrConflict", err)
	}
}

func TestDecodeStateRejectsTriggersWithoutABriefID(t *testing.T) {
	t.Parallel()
	d := Definition()
	id := uuid.New()
	good, _ := json.Marshal(CreatedPayload{BriefID: id})
	if err := d.DecodeState(good); err != nil {
		t.Fatalf("valid payload %s: %v", good, err)
	}
	for _, p := range []string{
		`{}`, `{"brief_id": null}`, `{"brief_id": ""}`, `{"brief_id": "not-a-uuid"}`,
		`{"brief_id": 42}`, `{"brief_id": "00000000-0000-0000-0000-000000000000"}`, `[]`, `"x"`, ``,
	} {
		if err := d.DecodeState(json.RawMessage(p)); err == nil {
			t.Errorf("payload %q accepted", p)
		}
	}
}
