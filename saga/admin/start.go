package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// StartRequest starts a saga by hand: its trigger event is written to the
// outbox, so the stream and the correlator start it exactly as they start
// any other (one instance per trigger event and saga).
type StartRequest struct {
	// Saga names the saga; its newest known version's first trigger gives
	// the event's type and aggregate type.
	Saga string `json:"saga"`
	// Payload is the trigger event's payload (a JSON object); empty is {}.
	Payload json.RawMessage `json:"payload"`
	// AggregateID is the trigger event's aggregate id (optional).
	AggregateID string `json:"aggregate_id"`
	// IdempotencyKey makes the start happen at most once: the same key for
	// the same saga and tenant names the same trigger event, which starts
	// its saga once however often it is sent. Empty: every request starts
	// a new instance.
	IdempotencyKey string `json:"idempotency_key"`
	// TenantID is the trigger event's tenant; a tenant-scoped Admin forces
	// its own (and refuses another).
	TenantID uuid.UUID `json:"tenant_id"`
}

// StartResult says which trigger event stands for the start and whether
// this request wrote it.
type StartResult struct {
	Saga      string    `json:"saga"`
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
	// Created is false when the idempotency key's event was already there.
	Created bool `json:"created"`
	// InstanceID is the instance the event started, once the relay has
	// streamed it (nil before).
	InstanceID *uuid.UUID `json:"instance_id"`
}

// startNamespace derives trigger event ids from idempotency keys (UUIDv5).
var startNamespace = uuid.MustParse("6f1c2a0e-5b7d-4f43-9d8e-2a64c1f0b7a1")

// maxIdempotencyKey bounds an idempotency key.
const maxIdempotencyKey = 200

// Start writes the trigger event of req.Saga into table (the relay's outbox
// table, schema-qualified or not). It needs a Registry that knows the saga.
func (a *Admin) Start(ctx context.Context, table string, req StartRequest) (StartResult, error) {
	req.Saga = strings.TrimSpace(req.Saga)
	if req.Saga == "" {
		return StartResult{}, saga.Errorf(saga.ErrInvalid, "saga is missing; name the saga to start, e.g. \"order_fulfilment\"")
	}
	if len(req.IdempotencyKey) > maxIdempotencyKey {
		return StartResult{}, saga.Errorf(saga.ErrInvalid, "idempotency_key is %d bytes; keep it to %d", len(req.IdempotencyKey), maxIdempotencyKey)
	}
	payload := req.Payload
	if len(strings.TrimSpace(string(payload))) == 0 {
		payload = json.RawMessage(`{}`)
	}
	var obj map[string]any
	if err := json.Unmarshal(payload, &obj); err != nil || obj == nil {
		return StartResult{}, saga.Errorf(saga.ErrInvalid, "payload must be a JSON object (the trigger event's payload), e.g. {\"order_id\": \"o-1\"}")
	}
	def, ok := a.latest(req.Saga)
	if !ok {
		return StartResult{}, saga.Errorf(saga.ErrNotFound, "no saga %q is known (defined in this binary or stored in saga_definitions); see relay sagas definitions or GET /v1/definitions", req.Saga)
	}
	if len(def.Triggers) == 0 || def.Triggers[0].EventType == "" || def.Triggers[0].EventType == retiredEventType {
		return StartResult{}, saga.Errorf(saga.ErrConflict, "saga %s has no trigger to start it by (its file was removed); load it again to start new instances", req.Saga)
	}
	trig := def.Triggers[0]
	tenant := req.TenantID
	if a.scope.Valid {
		if tenant != uuid.Nil && tenant != a.scope.UUID {
			return StartResult{}, saga.Errorf(saga.ErrInvalid, "this caller is scoped to tenant %s: it cannot start a saga for tenant %s", a.scope.UUID, tenant)
		}
		tenant = a.scope.UUID
	}
	if trig.TenantID != uuid.Nil {
		if tenant != uuid.Nil && tenant != trig.TenantID {
			return StartResult{}, saga.Errorf(saga.ErrInvalid, "saga %s starts only for tenant %s", req.Saga, trig.TenantID)
		}
		tenant = trig.TenantID
	}
	res := StartResult{Saga: def.Name, EventType: trig.EventType, Created: true}
	if req.IdempotencyKey != "" {
		res.EventID = uuid.NewSHA1(startNamespace, []byte(def.Name+"\x00"+tenant.String()+"\x00"+req.IdempotencyKey))
	} else if id, err := uuid.NewV7(); err == nil {
		res.EventID = id
	} else {
		res.EventID = uuid.New()
	}
	msg := outbox.Message{ID: res.EventID, TenantID: tenant, AggregateType: trig.AggregateType,
		AggregateID: req.AggregateID, EventType: trig.EventType, Payload: payload}
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		// The instance is the proof of a start: the outbox row may be gone
		// (retention) while the key's instance stays.
		var inst uuid.UUID
		err := tx.QueryRow(ctx, `SELECT id FROM saga_instances WHERE trigger_event_id = $1 AND saga_name = $2`, res.EventID, def.Name).Scan(&inst)
		if err == nil {
			res.Created, res.InstanceID = false, &inst
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		res.Created, err = outbox.WriteTableOnce(ctx, tx, table, msg)
		return err
	})
	if outbox.IsDuplicate(err) {
		res.Created, err = false, nil // a concurrent start with the same key won
	}
	if err != nil {
		return StartResult{}, err
	}
	return res, nil
}

// retiredEventType is declare.RetiredEventType (a saga whose file was
// removed), spelled here since saga/ does not import the loader.
const retiredEventType = "compensa.retired"

// latest is the newest known version of a saga.
func (a *Admin) latest(name string) (saga.Definition, bool) {
	if a.cfg.Registry == nil {
		return saga.Definition{}, false
	}
	var best saga.Definition
	found := false
	for _, d := range a.cfg.Registry.Definitions() {
		if d.Name == name && (!found || d.Version > best.Version) {
			best, found = d, true
		}
	}
	return best, found
}
