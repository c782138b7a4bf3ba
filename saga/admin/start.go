package admin

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

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
	// its saga once however often it is sent. The event's id is derived
	// from the key with the database's start_id secret, so nobody can
	// write another event under it first; an id held by anything but this
	// start (another tenant's, saga's or event type's) is ErrConflict.
	// Empty: every request starts a new instance.
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

// startNamespace is the UUIDv5 namespace of the trigger event ids of starts
// with an idempotency key. Knowing it is not enough to compute an id: the
// name begins with the database's start_id secret (startSecret).
var startNamespace = uuid.MustParse("6f1c2a0e-5b7d-4f43-9d8e-2a64c1f0b7a1")

// startSecret is the start_id secret of relay_secrets, read once and shared
// by every view of an Admin (ForTenant).
type startSecret struct {
	mu  sync.Mutex
	key []byte
}

// get returns the secret, reading it on first use; a failed read is tried
// again on the next call.
func (s *startSecret) get(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return s.key, nil
	}
	var key []byte
	err := q.QueryRow(ctx, `SELECT secret FROM relay_secrets WHERE name = 'start_id'`).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errors.New("admin: relay_secrets has no start_id secret; run relay migrate")
	}
	if err != nil {
		return nil, fmt.Errorf("admin: read the start_id secret: %w", err)
	}
	s.key = key
	return key, nil
}

// startEventID is the trigger event id of a start of sagaName for tenant
// with an idempotency key: a UUIDv5 whose name is the secret, then each
// field with its length, so that no two (saga, tenant, key) share a name.
func startEventID(secret []byte, sagaName string, tenant uuid.UUID, key string) uuid.UUID {
	name := append([]byte(nil), secret...)
	for _, f := range []string{sagaName, tenant.String(), key} {
		name = binary.AppendUvarint(name, uint64(len(f)))
		name = append(name, f...)
	}
	return uuid.NewSHA1(startNamespace, name)
}

// legacyStart finds a start with an idempotency key whose id was computed
// without the secret (written by a relay that had none): a key sent again
// still names it. Only an instance or an event of this tenant, this saga
// and the trigger's event type counts, since anyone could write under such
// an id; anything else there is ignored, and the start goes on under its
// secret id.
func legacyStart(ctx context.Context, tx pgx.Tx, table, sagaName string, tenant uuid.UUID, eventType, key string) (StartResult, bool, error) {
	res := StartResult{Saga: sagaName, EventType: eventType,
		EventID: uuid.NewSHA1(startNamespace, []byte(sagaName+"\x00"+tenant.String()+"\x00"+key))}
	var inst uuid.UUID
	err := tx.QueryRow(ctx, `SELECT id FROM saga_instances WHERE trigger_event_id = $1 AND saga_name = $2 AND tenant_id = $3`,
		res.EventID, sagaName, tenant).Scan(&inst)
	if err == nil {
		var other bool
		// An instance is this start's unless its event, still there, is of
		// another type.
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE id = $1 AND event_type <> $2)`,
			res.EventID, eventType).Scan(&other); err != nil || other {
			return StartResult{}, false, err
		}
		res.InstanceID = &inst
		return res, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return StartResult{}, false, err
	}
	var mine bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE id = $1 AND event_type = $2
		AND COALESCE(tenant_id, '00000000-0000-0000-0000-000000000000') = $3)`, res.EventID, eventType, tenant).Scan(&mine)
	return res, mine && err == nil, err
}

// errStartTaken is what a start learns when its key's event id is held by
// an event or an instance that is not this start: it names nothing of them.
func errStartTaken(key string) error {
	return saga.Errorf(saga.ErrConflict, "idempotency_key %q names an event that is not a start of this saga for this tenant; send the start with another idempotency_key", key)
}

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
		return StartResult{}, saga.Errorf(saga.ErrNotFound, "no saga %q is known (defined in this binary or stored in saga_definitions); %s; GET /v1/definitions lists them with their versions (the monitor's /definitions page shows the same)", req.Saga, a.knownNames())
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
		secret, err := a.secret.get(ctx, a.cfg.Pool)
		if err != nil {
			return StartResult{}, err
		}
		res.EventID = startEventID(secret, def.Name, tenant, req.IdempotencyKey)
	} else if id, err := uuid.NewV7(); err == nil {
		res.EventID = id
	} else {
		res.EventID = uuid.New()
	}
	ident, err := outbox.ParseTableName(table)
	if err != nil {
		return StartResult{}, err
	}
	msg := outbox.Message{ID: res.EventID, TenantID: tenant, AggregateType: trig.AggregateType,
		AggregateID: req.AggregateID, EventType: trig.EventType, Payload: payload}
	err = pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		// The instance is the proof of a start: the outbox row may be gone
		// (retention) while the key's instance stays. Whatever holds the id
		// is this start only if its tenant, saga and event type are the
		// start's; anything else is refused without a word about it.
		var inst, instTenant uuid.UUID
		err := tx.QueryRow(ctx, `SELECT id, tenant_id FROM saga_instances WHERE trigger_event_id = $1 AND saga_name = $2`,
			res.EventID, def.Name).Scan(&inst, &instTenant)
		found := err == nil
		switch {
		case found && instTenant != tenant:
			return errStartTaken(req.IdempotencyKey)
		case !found && !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		var rowTenant uuid.NullUUID
		var rowType string
		err = tx.QueryRow(ctx, `SELECT tenant_id, event_type FROM `+ident.Quoted()+` WHERE id = $1`, res.EventID).Scan(&rowTenant, &rowType)
		switch {
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return err
		case err == nil && (rowTenant.UUID != tenant || rowType != trig.EventType):
			return errStartTaken(req.IdempotencyKey)
		case err == nil || found:
			res.Created = false
			if found {
				res.InstanceID = &inst
			}
			return nil
		}
		if req.IdempotencyKey != "" {
			legacy, ok, err := legacyStart(ctx, tx, ident.Quoted(), def.Name, tenant, trig.EventType, req.IdempotencyKey)
			if err != nil || ok {
				res = legacy
				return err
			}
		}
		return outbox.WriteTable(ctx, tx, table, msg)
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
// knownNames says which saga names Start knows, for the message of an
// unknown one: at most ten, sorted.
func (a *Admin) knownNames() string {
	if a.cfg.Registry == nil {
		return "none is known to this process"
	}
	seen := map[string]bool{}
	var names []string
	for _, d := range a.cfg.Registry.Definitions() {
		if !seen[d.Name] && d.Name != "" {
			seen[d.Name] = true
			names = append(names, d.Name)
		}
	}
	if len(names) == 0 {
		return "none is known: load saga files with relay run --sagas DIR"
	}
	sort.Strings(names)
	more := ""
	if len(names) > 10 {
		more = fmt.Sprintf(" and %d more", len(names)-10)
		names = names[:10]
	}
	return "known: " + strings.Join(names, ", ") + more
}

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
