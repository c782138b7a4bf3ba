package correlator

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/outbox"
)

// plan is what one batch asks of the database, as column arrays ready to be
// unnested: one statement per kind of effect, whatever the batch size.
type plan struct {
	seen int

	// starts
	// UUIDs go as [16]byte: pgx encodes those directly, while uuid.UUID
	// takes a slower path through driver.Valuer for every element.
	// startID is the new instance's id, a UUIDv7: ids that grow with time
	// go to the right edge of the primary key and of the (created_at, id)
	// and (next_attempt_at, id) indexes instead of a random leaf page each,
	// which keeps a start's cost flat as the table grows. A replayed
	// trigger gets a fresh id that the unique trigger index discards.
	startID        [][16]byte
	startTenant    [][16]byte
	startWorkspace []*[16]byte
	startSaga      []string
	startVersion   []int32
	startTrigger   [][16]byte
	startCorr      []*[16]byte
	startContext   []string
	startDeadline  []int64 // microseconds; 0 = no deadline
	// startXids are the source transactions of the triggers, each once: the
	// batch waits until they are visible (see waitVisible).
	startXids []int64
	// startAggregate is the trigger's aggregate id (nil when it has none),
	// kept on the instance so that an operator can find it by that id.
	startAggregate []*string
	// startConcKey and startConcLimit are the concurrency key and limit of
	// an instance whose saga has one (nil otherwise); startConcLSN and
	// startConcOrd its trigger's place in the stream (commit LSN, then
	// position in the batch): the order in which instances of a key run.
	startConcKey   []*string
	startConcLimit []*int32
	startConcLSN   []*string
	startConcOrd   []*int32
	// keyed: some start has a concurrency key (sqlStartKeyed).
	keyed bool
	// guarded: start with ON CONFLICT DO NOTHING (sqlStartGuarded), for a
	// batch that may hold triggers started before.
	guarded bool
	// ordBase is the number of starts planned before this plan's in the
	// same batch (a batch applied one event at a time), so that startConcOrd
	// is the position in the batch either way.
	ordBase int32
	// startTrace is the traceparent of each start's span (nil untraced).
	startTrace []*string

	// tr makes the spans of the events that start sagas or are replies
	// (nil: tracing off); spans are ended once the batch commits or fails.
	tr    trace.Tracer
	spans []trace.Span

	// reply candidates: events with a correlation id that start nothing
	replyEvent   [][16]byte
	replyCorr    [][16]byte
	replyPayload []string
	replyTenant  [][16]byte

	// dead letters
	deadEventID   []string
	deadEventType []string
	deadLSN       []string
	deadReason    []string
	deadRaw       []string
	// What became of each event: started, reply, ignored, filtered, parked.
	outStarted, outReply, outIgnored, outFiltered, outParked int
	// noID numbers poison rows without an id per commit LSN.
	noID map[uint64]int
}

// reserve makes room in an empty plan's start columns for n starts, so
// that planning a batch of many triggers does not grow them step by step.
func (p *plan) reserve(n int) {
	if len(p.startSaga) > 0 || cap(p.startSaga) >= n {
		return
	}
	p.startID, p.startTenant, p.startTrigger = make([][16]byte, 0, n), make([][16]byte, 0, n), make([][16]byte, 0, n)
	p.startWorkspace, p.startCorr = make([]*[16]byte, 0, n), make([]*[16]byte, 0, n)
	p.startSaga, p.startContext = make([]string, 0, n), make([]string, 0, n)
	p.startVersion = make([]int32, 0, n)
	p.startDeadline = make([]int64, 0, n)
	p.startAggregate, p.startConcKey, p.startConcLSN, p.startTrace = make([]*string, 0, n), make([]*string, 0, n), make([]*string, 0, n), make([]*string, 0, n)
	p.startConcLimit, p.startConcOrd = make([]*int32, 0, n), make([]*int32, 0, n)
}

func (p *plan) empty() bool {
	return len(p.startSaga) == 0 && len(p.replyEvent) == 0 && len(p.deadReason) == 0
}

// add routes one event into the plan.
func (p *plan) add(r routes, ev *outbox.Event) {
	p.seen++
	if ev.Poison != "" {
		p.park(ev, ev.Poison)
		return
	}
	defs, filtered, err := r.match(ev)
	if err != nil {
		p.park(ev, err.Error())
		return
	}
	if len(defs) == 0 && !ev.CorrelationID.Valid {
		if filtered {
			p.outFiltered++ // a trigger's filter said no
		} else {
			p.outIgnored++ // not ours: skipped without a statement
		}
		return
	}
	// A payload that was a jsonb value needs no check: jsonb takes its own
	// text back.
	if !ev.PayloadJSONB {
		if err := usableJSON(ev.Payload); err != nil {
			p.park(ev, "payload: "+err.Error())
			return
		}
	}
	if len(defs) == 0 {
		p.outReply++
		p.traceReply(ev)
		p.replyEvent = append(p.replyEvent, ev.ID)
		p.replyCorr = append(p.replyCorr, ev.CorrelationID.UUID)
		p.replyPayload = append(p.replyPayload, string(ev.Payload))
		p.replyTenant = append(p.replyTenant, ev.TenantID)
		return
	}
	if ev.ID == uuid.Nil {
		p.park(ev, "event has no id: a trigger needs one to start its saga exactly once")
		return
	}
	// Validate against every saga first so that a poison trigger starts none
	// of them: parking is all or nothing per event.
	var states []string // per definition, when one builds its own start state
	var keys []*string  // per definition, its concurrency key
	for i, d := range defs {
		if c := d.Concurrency; c != nil && c.Key != nil {
			k, err := c.Key(*ev)
			if err != nil {
				p.park(ev, fmt.Sprintf("the concurrency key of saga %s: %v", d.Key(), err))
				return
			}
			if keys == nil {
				keys = make([]*string, len(defs))
			}
			k = c.ScopedKey(*ev, k)
			keys[i] = &k
		}
		if d.DecodeState != nil {
			if err := d.DecodeState(ev.Payload); err != nil {
				p.park(ev, fmt.Sprintf("payload does not fit saga %s: %v", d.Key(), err))
				return
			}
		}
		if d.StartState != nil {
			st, err := d.StartState(*ev)
			if err != nil {
				p.park(ev, fmt.Sprintf("payload does not fit saga %s: %v", d.Key(), err))
				return
			}
			if states == nil {
				states = make([]string, len(defs))
			}
			states[i] = string(st)
		}
	}
	var ws *[16]byte
	if w := workspaceOf(ev); w != nil {
		b := [16]byte(*w)
		ws = &b
	}
	var corr *[16]byte
	if ev.CorrelationID.Valid {
		c := [16]byte(ev.CorrelationID.UUID)
		corr = &c
	}
	if ev.Xid != 0 && (len(p.startXids) == 0 || p.startXids[len(p.startXids)-1] != int64(ev.Xid)) {
		p.startXids = append(p.startXids, int64(ev.Xid))
	}
	var agg *string
	if ev.AggregateID != "" {
		a := instanceAggregate(ev.AggregateID)
		agg = &a
	}
	p.outStarted++
	tctx := p.traceEvent(ev)
	for i, d := range defs {
		p.startID = append(p.startID, newInstanceID())
		p.traceStart(tctx, d, p.startID[len(p.startID)-1], ev.ID)
		p.startAggregate = append(p.startAggregate, agg)
		p.startTenant = append(p.startTenant, ev.TenantID)
		p.startWorkspace = append(p.startWorkspace, ws)
		p.startSaga = append(p.startSaga, d.Name)
		p.startVersion = append(p.startVersion, int32(d.Version))
		p.startTrigger = append(p.startTrigger, ev.ID)
		p.startCorr = append(p.startCorr, corr)
		if states != nil && d.StartState != nil {
			p.startContext = append(p.startContext, states[i])
		} else {
			p.startContext = append(p.startContext, string(ev.Payload))
		}
		p.startDeadline = append(p.startDeadline, d.Deadline.Microseconds())
		if keys != nil && keys[i] != nil {
			limit := int32(d.Concurrency.Limit)
			lsn := fmt.Sprintf("%X/%X", ev.LSN>>32, uint32(ev.LSN))
			ord := p.ordBase + int32(len(p.startSaga))
			p.startConcKey = append(p.startConcKey, keys[i])
			p.startConcLimit = append(p.startConcLimit, &limit)
			p.startConcLSN = append(p.startConcLSN, &lsn)
			p.startConcOrd = append(p.startConcOrd, &ord)
			p.keyed = true
		} else {
			p.startConcKey = append(p.startConcKey, nil)
			p.startConcLimit = append(p.startConcLimit, nil)
			p.startConcLSN = append(p.startConcLSN, nil)
			p.startConcOrd = append(p.startConcOrd, nil)
		}
	}
}

// idRandom buffers the random bits of instance ids: one read of the
// system's generator serves 256 ids instead of one each.
var idRandom = struct {
	sync.Mutex
	r *bufio.Reader
}{r: bufio.NewReaderSize(rand.Reader, 16*256)}

// newInstanceID returns a UUIDv7 (time-ordered), or a random UUID in the
// unlikely case that the clock-ordered one cannot be made.
func newInstanceID() [16]byte {
	idRandom.Lock()
	id, err := uuid.NewV7FromReader(idRandom.r)
	idRandom.Unlock()
	if err == nil {
		return id
	}
	return uuid.New()
}

func (p *plan) park(ev *outbox.Event, reason string) {
	p.outParked++
	raw := ev.Raw
	if raw == nil {
		raw = decodedRow(ev)
	}
	b, err := json.Marshal(sanitizeForJSONB(raw))
	if err != nil {
		b = []byte(fmt.Sprintf(`{"unencodable": %q}`, err.Error()))
	}
	id := ev.RawID
	if id == "" && ev.ID != uuid.Nil {
		id = ev.ID.String()
	}
	if id == "" {
		// Rows without an id must not collide on the dead-letter key
		// (lsn, event_id, event_type): number them within their source
		// transaction, which a replay numbers the same way.
		if p.noID == nil {
			p.noID = map[uint64]int{}
		}
		p.noID[ev.LSN]++
		id = fmt.Sprintf("(no id) #%d", p.noID[ev.LSN])
	}
	p.deadEventID = append(p.deadEventID, deadKey(id))
	p.deadEventType = append(p.deadEventType, deadKey(ev.EventType))
	p.deadLSN = append(p.deadLSN, lsnString(ev.LSN))
	p.deadReason = append(p.deadReason, stripNUL(reason))
	p.deadRaw = append(p.deadRaw, string(b))
}

// decodedRow is the whole decoded event in the form of a raw row (our field
// names, values as text, nil for NULL): a re-drive must restart it under its
// own tenant, with its headers and its correlation and causation ids.
func decodedRow(ev *outbox.Event) map[string]any {
	id := ev.RawID
	if id == "" && ev.ID != uuid.Nil {
		id = ev.ID.String()
	}
	row := map[string]any{
		"id": id, "tenant_id": ev.TenantID.String(), "aggregate_type": ev.AggregateType,
		"aggregate_id": ev.AggregateID, "event_type": ev.EventType, "payload": string(ev.Payload),
		"headers": nil, "correlation_id": nil, "causation_id": nil, "created_at": nil,
	}
	if len(ev.Headers) > 0 {
		row["headers"] = string(ev.Headers)
	}
	if ev.CorrelationID.Valid {
		row["correlation_id"] = ev.CorrelationID.UUID.String()
	}
	if ev.CausationID.Valid {
		row["causation_id"] = ev.CausationID.UUID.String()
	}
	if !ev.CreatedAt.IsZero() {
		row["created_at"] = ev.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	return row
}

// usableJSON reports why a payload cannot become a saga's state or a reply:
// it must be JSON that PostgreSQL's jsonb accepts (outbox.CheckJSONB).
func usableJSON(p json.RawMessage) error { return checkPayload(p) }

// checkPayload is outbox.CheckJSONB; tests replace it to reach the fallback
// in HandleBatch.
var checkPayload = outbox.CheckJSONB

// workspaceOf finds a workspace id in the payload or the headers.
func workspaceOf(ev *outbox.Event) *uuid.UUID {
	for _, src := range []json.RawMessage{ev.Payload, ev.Headers} {
		// Most events carry none: a byte search spares decoding them.
		if len(src) == 0 || src[0] != '{' || !bytes.Contains(src, []byte(`"workspace_id"`)) {
			continue
		}
		var probe struct {
			WorkspaceID string `json:"workspace_id"`
		}
		if json.Unmarshal(src, &probe) == nil && probe.WorkspaceID != "" {
			if u, err := uuid.Parse(probe.WorkspaceID); err == nil {
				return &u
			}
		}
	}
	return nil
}

func lsnString(lsn uint64) string {
	return fmt.Sprintf("%X/%X", uint32(lsn>>32), uint32(lsn))
}

// maxRawValue bounds each value of a dead letter's raw row: jsonb holds at
// most 256 MB in one value, and a row may carry several huge columns. A
// longer value is kept clipped; the outbox row keeps the whole (see
// RetryDeadLetterFromOutbox).
const maxRawValue = 16 << 20

// sanitizeForJSONB makes a raw row storable in jsonb: strings lose NUL
// bytes, invalid UTF-8 is replaced and huge values are clipped, so that
// parking a poison row can never fail the way the row itself did. A value
// that is not a string (a re-driven row's) is kept as its JSON text.
func sanitizeForJSONB(raw map[string]any) map[string]any {
	out := make(map[string]any, len(raw))
	for k, v := range raw {
		k = stripNUL(k)
		switch t := v.(type) {
		case nil:
			out[k] = nil
		case string:
			out[k] = clipRaw(stripNUL(t))
		case []byte:
			out[k] = clipRaw(stripNUL(string(t)))
		default:
			b, err := json.Marshal(t)
			if err != nil {
				b = []byte(fmt.Sprint(t))
			}
			out[k] = clipRaw(stripNUL(string(b)))
		}
	}
	return out
}

func clipRaw(s string) string {
	if len(s) <= maxRawValue {
		return s
	}
	cut := maxRawValue
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (clipped: %d bytes in all)", len(s))
}

func stripNUL(s string) string {
	s = string(bytes.ToValidUTF8([]byte(s), []byte("\uFFFD")))
	return string(bytes.ReplaceAll([]byte(s), []byte{0}, nil))
}

// maxKeyBytes bounds the producer text that goes into the dead-letter index:
// a btree entry must stay under about 2.7 kB, or parking itself would fail.
const maxKeyBytes = 200

// maxAggregateBytes bounds the aggregate id an instance keeps for finding
// it (saga_aggregate_idx): a btree entry must stay under about 2.7 kB, or
// the start, and with it the batch, would fail.
const maxAggregateBytes = 1000

// aggregateLimit is maxAggregateBytes; tests raise it to reach the
// fallback in HandleBatch.
var aggregateLimit = maxAggregateBytes

// instanceAggregate is the aggregate id as saga_instances keeps it: as it
// is, or clipped with a hash of the whole when longer than
// maxAggregateBytes.
func instanceAggregate(s string) string {
	if len(s) <= aggregateLimit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	cut := aggregateLimit - 20
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…" + hex.EncodeToString(sum[:8])
}

// deadKey is producer text made fit for the dead-letter key: valid UTF-8
// without NUL (text refuses both) and at most maxKeyBytes long. A value that
// had to change ends in "…" and a hash of the original, so that two ids
// differing only in the bytes replaced stay two dead letters.
func deadKey(s string) string { return clipKey(stripNUL(s), s) }

// clipKey returns s when it is orig and short enough, else s shortened to
// fit maxKeyBytes with a hash of orig (the raw row keeps the original).
func clipKey(s, orig string) string {
	if len(s) <= maxKeyBytes && s == orig {
		return s
	}
	sum := sha256.Sum256([]byte(orig))
	cut := min(len(s), maxKeyBytes-20)
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…" + hex.EncodeToString(sum[:8])
}
