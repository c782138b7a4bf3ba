package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/compensa/compensa/saga"
)

type orderState struct {
	OrderID  string `json:"order_id"`
	Reserved bool   `json:"reserved"`
}

func TestDefineDecodesTheTriggerIntoTheStateType(t *testing.T) {
	t.Parallel()
	def := saga.Define(saga.TypedDefinition[orderState]{
		Name: "orders", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Check: func(s *orderState) error {
			if s.OrderID == "" {
				return errors.New("order_id is required")
			}
			return nil
		},
		Steps: []saga.TypedStep[orderState]{{
			Name: "reserve",
			Do: func(_ context.Context, s *orderState, _ *saga.StepTx) error {
				s.Reserved = true
				return nil
			},
		}},
	})
	if err := saga.NewRegistry().Register(def); err != nil {
		t.Fatal(err)
	}
	if err := def.DecodeState(json.RawMessage(`{"order_id":"o-1"}`)); err != nil {
		t.Fatalf("good payload refused: %v", err)
	}
	err := def.DecodeState(json.RawMessage(`{"order_id":7}`))
	if !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), "orderState") {
		t.Fatalf("payload of the wrong shape: got %v, want ErrInvalid naming the type", err)
	}
	if err := def.DecodeState(json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "order_id is required") {
		t.Fatalf("Check not applied: %v", err)
	}

	// The step sees the decoded state and its changes are saved as JSON.
	x := &saga.StepTx{State: json.RawMessage(`{"order_id":"o-1"}`)}
	if err := def.Steps[0].Do(context.Background(), x); err != nil {
		t.Fatal(err)
	}
	got, err := saga.DecodeState[orderState](x.State)
	if err != nil || got != (orderState{OrderID: "o-1", Reserved: true}) {
		t.Fatalf("saved state = %+v (%v)", got, err)
	}

	// A state that no longer decodes is a permanent failure of the step.
	x = &saga.StepTx{State: json.RawMessage(`{"order_id":[]}`)}
	if err := def.Steps[0].Do(context.Background(), x); !saga.IsPermanent(err) {
		t.Fatalf("undecodable state: got %v, want a permanent error", err)
	}
}

func TestTypedStepWithoutDoIsRefused(t *testing.T) {
	t.Parallel()
	def := saga.Define(saga.TypedDefinition[orderState]{
		Name: "orders", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps:    []saga.TypedStep[orderState]{{Name: "reserve"}},
	})
	if err := saga.NewRegistry().Register(def); !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), "Steps[0].Do") {
		t.Fatalf("got %v, want ErrInvalid naming Steps[0].Do", err)
	}
}
