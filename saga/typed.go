package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"time"
)

// TypedDefinition declares a saga whose state is a Go value of type S,
// carried between steps as JSON. Define turns it into a Definition.
type TypedDefinition[S any] struct {
	Name     string
	Version  int
	Triggers []Trigger
	// Deadline: see Definition.Deadline.
	Deadline time.Duration
	Steps    []TypedStep[S]
	// Check, when set, validates the initial state decoded from a trigger's
	// payload (required fields, ranges). An error parks the trigger event as
	// a dead letter with the message.
	Check func(state *S) error
}

// TypedStep is a Step whose functions see the state as an S. The state Do
// leaves in *state is saved for the next step.
type TypedStep[S any] struct {
	Name string
	// Do: see Step.Do. Changes to *state are saved when the step commits.
	Do func(ctx context.Context, state *S, x *StepTx) error
	// Compensate: see Step.Compensate. It gets the latest saved state.
	Compensate func(ctx context.Context, state S, x *StepTx) error
	// OnReply: see Step.OnReply. Changes to *state are saved.
	OnReply           func(ctx context.Context, state *S, reply Reply, x *StepTx) error
	Retry             RetryPolicy
	CompensationRetry RetryPolicy
	Timeout           time.Duration
	ReplyTimeout      time.Duration
}

// Define turns a typed declaration into the Definition the registry holds:
// DecodeState checks that a trigger's payload decodes into S (and passes
// Check), and every step decodes the state before its function runs and
// encodes it after. A state the step cannot decode (a payload written for
// another version of S) is a permanent failure of that step.
func Define[S any](d TypedDefinition[S]) Definition {
	def := Definition{
		Name:     d.Name,
		Version:  d.Version,
		Triggers: d.Triggers,
		Deadline: d.Deadline,
		Steps:    make([]Step, len(d.Steps)),
	}
	check := d.Check
	def.DecodeState = func(payload json.RawMessage) error {
		s, err := decodeState[S](payload)
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(&s); err != nil {
				return Errorf(ErrInvalid, "state check: %v", err)
			}
		}
		return nil
	}
	for i, ts := range d.Steps {
		def.Steps[i] = ts.step()
	}
	return def
}

func (ts TypedStep[S]) step() Step {
	s := Step{
		Name:              ts.Name,
		Retry:             ts.Retry,
		CompensationRetry: ts.CompensationRetry,
		Timeout:           ts.Timeout,
		ReplyTimeout:      ts.ReplyTimeout,
	}
	if do := ts.Do; do != nil {
		s.Do = func(ctx context.Context, x *StepTx) error {
			st, err := decodeState[S](x.State)
			if err != nil {
				return Permanent(err)
			}
			if err := do(ctx, &st, x); err != nil {
				return err
			}
			return x.saveState(st)
		}
	}
	if comp := ts.Compensate; comp != nil {
		s.Compensate = func(ctx context.Context, x *StepTx) error {
			st, err := decodeState[S](x.State)
			if err != nil {
				return err
			}
			return comp(ctx, st, x)
		}
	}
	if on := ts.OnReply; on != nil {
		s.OnReply = func(ctx context.Context, x *StepTx, r Reply) error {
			st, err := decodeState[S](x.State)
			if err != nil {
				return Permanent(err)
			}
			if err := on(ctx, &st, r, x); err != nil {
				return err
			}
			return x.saveState(st)
		}
	}
	return s
}

// saveState encodes a typed state into x.State.
func (x *StepTx) saveState(st any) error {
	b, err := json.Marshal(st)
	if err != nil {
		return Permanent(Errorf(ErrInvalid, "encode state of step %s: %v", x.StepName, err))
	}
	x.State = b
	return nil
}

// decodeState decodes a JSON state into S. An empty state decodes as the zero
// S, so that a saga started with an empty payload can still run.
func decodeState[S any](raw json.RawMessage) (S, error) {
	var s S
	if len(bytes.TrimSpace(raw)) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, Errorf(ErrInvalid, "state does not decode into %T: %v", s, err)
	}
	return s, nil
}

// DecodeState decodes an instance's JSON state (Instance.Context) into S, for
// code that reads instances outside a step (monitors, tests).
func DecodeState[S any](raw json.RawMessage) (S, error) { return decodeState[S](raw) }
