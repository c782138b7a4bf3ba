// Package redissink appends outbox events to Redis streams, and promises:
//
//   - One entry per event within the dedupe window. Each event is added by a
//     Lua script that runs atomically on the server: if the key
//     <stream>:dedupe:<id> exists, the event was added before and the
//     script returns that entry's id; otherwise it adds the entry (XADD,
//     MAXLEN ~ n when trimming is set) and sets the key to the entry's id
//     with the window as its time to live (sink.RedisSpec.DedupeWindow,
//     default 24h). A replay or a resend within the window adds nothing; one
//     later than the window adds a second entry with the same id field. The
//     key costs about 100 bytes per event for the window. Redis 8.2's XADD
//     IDMP would do the same inside the stream, but Debian's Redis (7.0)
//     has it not, and the script works on both.
//   - Durable as Redis is configured. Deliver returns success once Redis
//     executed the script; an entry survives a crash of Redis only with
//     appendonly yes and appendfsync always (everysec can lose the last
//     second). The fan-out's guarantee is as durable as that setting.
//   - Order per aggregate. A batch's scripts are pipelined on one
//     connection and executed in commit order; once an event of an
//     aggregate fails, its later events count as not delivered
//     (sink.ErrHeldBack) and are resent with the same ids, which the
//     dedupe key turns into no-ops when they had been added.
//   - Event data names no key. The stream's name is the template's
//     expansion with each placeholder's value made one part (its dots,
//     ':', braces, spaces and control characters become '_'), after a
//     literal prefix the sinks file requires, so an event cannot write to
//     another key, a dedupe key or another cluster slot.
//   - Outages are errors. A connection that fails, a server loading its
//     data or out of memory fails the events not added (the fan-out parks
//     them); a stream key holding another type refuses its events only.
//   - What the server cannot take is refused, not an outage. Redis reads
//     no value longer than its proto-max-bulk-len (512 MB unless
//     configured) and closes the connection on one, failing every command
//     sent with it: an event with a larger field (the payload field, the
//     envelope, is the largest) is refused before it is sent
//     (sink.EventError). The sink reads the server's setting on every new
//     connection (CONFIG GET; when that is not allowed, Redis's default
//     stands).
//   - One Redis, not a cluster. The script's two keys (the stream and the
//     dedupe key) hash to different cluster slots, which Redis Cluster
//     refuses in one script: a server in cluster mode (cluster_enabled:1
//     in INFO, read on every new connection, or a MOVED, ASK, CROSSSLOT,
//     CLUSTERDOWN or TRYAGAIN reply) is an outage whose reason says that
//     Redis Cluster is not supported.
//   - No credentials in errors. The password comes from the environment
//     (Config.Password) and is cut out of every error the sink returns.
//
// Each entry has the fields id (the outbox id), event_type,
// aggregate_type, aggregate_id, tenant_id, correlation_id, causation_id and
// poison when set, each key of the row's headers (traceparent among them),
// and payload: the event's JSON envelope (sink.Event.Envelope).
package redissink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/compensa/compensa/sink"
)

// Config configures a Redis streams sink.
type Config struct {
	// URL is redis:// or rediss:// (TLS).
	URL string
	// Password (from the variable named by redis.password_env); empty: the
	// URL's, if any.
	Password string
	Stream   sink.Template
	// MaxLen trims each stream to about this many entries; 0: no trimming.
	MaxLen int
	// DedupeWindow is how long an added id is remembered (default 24h).
	DedupeWindow time.Duration
	// Timeout bounds dialing and each round trip.
	Timeout time.Duration
	// Name is the client's name (CLIENT LIST).
	Name string
}

// addScript adds one event unless its dedupe key says it was added.
// KEYS: the stream, the dedupe key. ARGV: the window in ms, MAXLEN (0:
// none), then the entry's fields and values.
var addScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[2])
if prev then
  return prev
end
local id
if tonumber(ARGV[2]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
`)

// defaultMaxBulk is Redis's default proto-max-bulk-len: the longest value
// (bulk string) it reads in a command.
const defaultMaxBulk = 512 << 20

// ErrCluster is the reason a sink pointed at a Redis Cluster node cannot
// deliver.
var ErrCluster = errors.New("Redis Cluster is not supported: this sink adds each entry and its dedupe key in one script, and their keys are in different cluster slots; point redis.url at a standalone Redis (or the primary of one with replicas)")

// clusterReplies start the errors only a node of Redis Cluster answers.
var clusterReplies = []string{"MOVED ", "ASK ", "CROSSSLOT ", "CLUSTERDOWN ", "TRYAGAIN "}

// Sink is a Redis streams destination; safe for concurrent use.
type Sink struct {
	cfg Config
	rdb *redis.Client
	// maxBulk is the server's proto-max-bulk-len, as last read.
	maxBulk atomic.Int64
	// connected: a connection was made, so maxBulk is the server's (or
	// the default, when the server would not say).
	connected atomic.Bool
}

var _ sink.Sink = (*Sink)(nil)

// New creates the client; it connects on the first delivery, so a relay
// starts while Redis is down and parks meanwhile.
func New(cfg Config) (*Sink, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.DedupeWindow <= 0 {
		cfg.DedupeWindow = sink.DefaultDedupeWindow
	}
	if cfg.Name == "" {
		cfg.Name = "compensa-relay"
	}
	opt, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redis sink: url: %w", redactErr(err, cfg.Password))
	}
	if cfg.Password != "" {
		opt.Password = cfg.Password
	}
	opt.ClientName = cfg.Name
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = cfg.Timeout, cfg.Timeout, cfg.Timeout
	// The fan-out retries what fails (parked, then drained): a retry here
	// would only hold the stream longer while Redis is down.
	opt.MaxRetries = -1
	opt.PoolSize = 4
	s := &Sink{cfg: cfg}
	s.maxBulk.Store(defaultMaxBulk)
	opt.OnConnect = s.onConnect
	s.rdb = redis.NewClient(opt)
	return s, nil
}

// onConnect reads, in one round trip on each new connection, the longest
// value the server takes and whether it is a cluster node. A server that
// refuses CONFIG or INFO (an ACL, a managed service, a proxy) leaves the
// defaults; a cluster node fails the connection with ErrCluster, so the
// sink is down with that reason.
func (s *Sink) onConnect(ctx context.Context, cn *redis.Conn) error {
	var bulk *redis.MapStringStringCmd
	var info *redis.StringCmd
	cn.Pipelined(ctx, func(p redis.Pipeliner) error {
		bulk = p.ConfigGet(ctx, "proto-max-bulk-len")
		info = p.Info(ctx, "cluster")
		return nil
	})
	for _, err := range []error{bulk.Err(), info.Err()} {
		if err != nil && !isRedisError(err) {
			return err // the connection failed, not the command
		}
	}
	if strings.Contains(info.Val(), "cluster_enabled:1") {
		return ErrCluster
	}
	if n, err := strconv.ParseInt(bulk.Val()["proto-max-bulk-len"], 10, 64); err == nil && n > 0 {
		s.maxBulk.Store(n)
	}
	s.connected.Store(true)
	return nil
}

// isRedisError reports whether err is a reply of the server (an error it
// answered), not a failure of the connection.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// Stream is the stream key an event is added to.
func (s *Sink) Stream(ev *sink.Event) string { return s.cfg.Stream.Expand(ev, cleanPart) }

// DedupeKey is the key that remembers that ev was added to stream.
func DedupeKey(stream, id string) string { return stream + ":dedupe:" + id }

// cleanPart makes a value one part of a key: no '.', which separates parts,
// no ':', which would reach the dedupe keys' name space, no braces (a
// cluster hash tag), spaces or control characters.
func cleanPart(v string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == '.' || r == ':' || r == '{' || r == '}' || r == 0x7f || unicode.IsSpace(r) || unicode.IsControl(r) {
			return '_'
		}
		return r
	}, v)
}

// fields are the entry's fields and values, in order.
func fields(ev *sink.Event) []any {
	hs := ev.MessageHeaders()
	out := make([]any, 0, 4+2*len(hs))
	out = append(out, "id", ev.ID)
	for _, h := range hs {
		// The entry's own fields are the relay's; a row's headers object
		// cannot add a second id or payload.
		if k := strings.ToLower(h.Key); k == "id" || k == "payload" {
			continue
		}
		out = append(out, h.Key, h.Value)
	}
	return append(out, "payload", ev.Envelope())
}

// Deliver adds evs in order, pipelined, and waits for every result.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	errs, noScript := s.deliver(ctx, evs)
	if noScript {
		// Redis restarted (or SCRIPT FLUSH) and forgot the script: load it
		// and send the batch again; what was added is not added twice.
		if err := addScript.Load(ctx, s.rdb).Err(); err != nil {
			for i := range errs {
				errs[i] = s.classify(err)
			}
		} else {
			errs, _ = s.deliver(ctx, evs)
		}
	}
	failed := map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] && errs[i] == nil {
			errs[i] = sink.ErrHeldBack
		}
		if errs[i] != nil {
			failed[k] = true
		}
	}
	return errs
}

func (s *Sink) deliver(ctx context.Context, evs []*sink.Event) (errs []error, noScript bool) {
	errs = make([]error, len(evs))
	if !s.connected.Load() {
		// The values are checked against the server's limit as the pipeline
		// is built, before it takes a connection: connect first.
		if err := s.rdb.Ping(ctx).Err(); err != nil {
			for i := range errs {
				errs[i] = s.classify(err)
			}
			return errs, false
		}
	}
	window := strconv.FormatInt(s.cfg.DedupeWindow.Milliseconds(), 10)
	maxLen := strconv.Itoa(s.cfg.MaxLen)
	cmds := make([]*redis.Cmd, len(evs))
	pipe := s.rdb.Pipeline()
	// refused holds the aggregates with an event refused before sending:
	// their later events are not sent either, or they would enter the
	// stream ahead of it (and a resend after it adds nothing).
	refused := map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if refused[k] {
			errs[i] = sink.ErrHeldBack
			continue
		}
		stream, err := s.cfg.Stream.Render(ev, cleanPart)
		if err != nil {
			// An expression of the stream's name failed: this event is
			// refused; the other aggregates go on.
			errs[i], refused[k] = sink.EventError(err), true
			continue
		}
		keys, fs := []string{stream, DedupeKey(stream, ev.ID)}, fields(ev)
		if err := s.tooLarge(keys, fs); err != nil {
			errs[i], refused[k] = sink.EventError(err), true
			continue
		}
		args := append([]any{window, maxLen}, fs...)
		cmds[i] = addScript.EvalSha(ctx, pipe, keys, args...)
	}
	_, execErr := pipe.Exec(ctx)
	for i, c := range cmds {
		if c == nil {
			continue // refused or held back before it was sent
		}
		// Delivered means Redis answered this script with the entry's id.
		// A pipeline whose connection failed to start (a wrong password)
		// reports that only from Exec, leaving each command without error
		// and without a reply.
		err := c.Err()
		if id, _ := c.Val().(string); err == nil && id != "" {
			continue
		}
		if err == nil {
			err = execErr
		}
		if err == nil {
			err = errors.New("no entry id in the reply")
		}
		if strings.HasPrefix(err.Error(), "NOSCRIPT") {
			noScript = true
		}
		errs[i] = s.classify(err)
	}
	return errs, noScript
}

// tooLarge refuses an entry with a key or a value (fields come as name,
// value) longer than the server reads in one command.
func (s *Sink) tooLarge(keys []string, fields []any) error {
	limit := s.maxBulk.Load()
	for _, k := range keys {
		if int64(len(k)) > limit {
			return fmt.Errorf("key of %d bytes (its id or stream name) is longer than the %d bytes Redis takes in one value (its proto-max-bulk-len)", len(k), limit)
		}
	}
	for i := 1; i < len(fields); i += 2 {
		var n int
		switch v := fields[i].(type) {
		case string:
			n = len(v)
		case []byte:
			n = len(v)
		}
		if int64(n) > limit {
			return fmt.Errorf("field %q of %d bytes is larger than the %d bytes Redis takes in one value (its proto-max-bulk-len)", fields[i-1], n, limit)
		}
	}
	return nil
}

// classify makes a stream key holding another type, or a value longer
// than the server reads (a proto-max-bulk-len lowered since the
// connection read it), a refusal of its event; a cluster node's reply says
// that Redis Cluster is not supported; everything else (the network, a
// server loading or out of memory) is an outage.
func (s *Sink) classify(err error) error {
	err = redactErr(err, s.cfg.Password)
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGTYPE"):
		return sink.EventError(fmt.Errorf("the stream's key holds another type of value; rename the key or change redis.stream: %w", err))
	case strings.Contains(msg, "Protocol error: invalid bulk length"):
		return sink.EventError(fmt.Errorf("a value of the entry is larger than Redis takes (its proto-max-bulk-len): %w", err))
	case errors.Is(err, ErrCluster):
		return err
	}
	for _, p := range clusterReplies {
		if strings.HasPrefix(msg, p) {
			return fmt.Errorf("%w (the server answered: %s)", ErrCluster, msg)
		}
	}
	return fmt.Errorf("redis: %w", err)
}

// redactErr cuts password out of err's message.
func redactErr(err error, password string) error {
	if password == "" || !strings.Contains(err.Error(), password) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), password, "xxxxx"))
}

// Close closes the client's connections.
func (s *Sink) Close() error { return s.rdb.Close() }
