package sinks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// full runs the full sink fault suite (RELAY_TEST_HEAVY=1, make test-sinks):
// 5 kills of the relay, 10 s broker and endpoint outages.
var full = testkit.Heavy()

// natsProcess is nats-server built from the Go module, run as a process of
// its own on a fixed port and store, so that it can be killed with -9 and
// started again.
type natsProcess struct {
	bin, store string
	port       int
	cmd        *exec.Cmd
	done       chan struct{}
}

func startNATS(t *testing.T) *natsProcess {
	t.Helper()
	dir := t.TempDir()
	n := &natsProcess{bin: filepath.Join(dir, "natsserver"), store: filepath.Join(dir, "store"), port: freePort(t)}
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", n.bin, "./natsserver")
	build.Dir = filepath.Dir(file)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build natsserver: %v\n%s", err, out)
	}
	n.start(t)
	t.Cleanup(n.kill)
	return n
}

func (n *natsProcess) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsProcess) start(t *testing.T) {
	t.Helper()
	n.cmd = exec.Command(n.bin, "-port", fmt.Sprint(n.port), "-store", n.store)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, _ := n.cmd.StdoutPipe()
	n.cmd.Stderr = io.Discard
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start natsserver: %v", err)
	}
	n.done = make(chan struct{})
	go func() { n.cmd.Wait(); close(n.done) }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("natsserver exited before it was ready")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("natsserver not ready within 60s")
	}
}

// kill sends SIGKILL: no flush, no goodbye to clients.
func (n *natsProcess) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		n.cmd.Process.Kill()
		<-n.done
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// killableEndpoint is a webhook endpoint on a fixed address that can be shut
// (connections refused) and opened again.
type killableEndpoint struct {
	addr string
	srv  *http.Server
	mu   sync.Mutex
	ids  []string
	bad  int
}

func (e *killableEndpoint) open(t *testing.T) {
	key, _ := webhook.DecodeSecret(secret)
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", e.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("endpoint listen: %v", err)
	}
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		e.mu.Lock()
		defer e.mu.Unlock()
		if !webhook.Verify(key, id, r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			e.bad++
			w.WriteHeader(401)
			return
		}
		e.ids = append(e.ids, id)
		w.WriteHeader(204)
	})}
	go e.srv.Serve(ln)
}

func (e *killableEndpoint) shut() { e.srv.Close() }

func (e *killableEndpoint) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ids...)
}

// natsReader reads the stream incrementally, in stream order.
type natsReader struct {
	url, stream string
	next        uint64
	ids         []string
}

func (r *natsReader) read() []string {
	nc, err := nats.Connect(r.url, nats.Timeout(2*time.Second))
	if err != nil {
		return r.ids
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, r.stream)
	if err != nil {
		return r.ids
	}
	info, err := st.Info(ctx)
	if err != nil {
		return r.ids
	}
	if r.next == 0 {
		r.next = 1
	}
	for ; r.next <= info.State.LastSeq; r.next++ {
		m, err := st.GetMsg(ctx, r.next)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			return r.ids
		}
		r.ids = append(r.ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return r.ids
}

// kafkaReader consumes every partition of the topic from the start.
type kafkaReader struct {
	cl  *kgo.Client
	ids []string
}

func (r *kafkaReader) read() []string {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := r.cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(rec *kgo.Record) {
			n++
			for _, h := range rec.Headers {
				if h.Key == "id" {
					r.ids = append(r.ids, string(h.Value))
				}
			}
		})
		if n == 0 {
			return r.ids
		}
	}
}

// TestSinkFaults kills the relay with -9 under load, kills the NATS server
// process with -9 and shuts the webhook endpoint for an outage, and then
// checks for every sink: each committed outbox row is delivered at least
// once and no rolled-back one is; deduplicated by id the count equals the
// committed count; per aggregate the first deliveries are in commit order.
// Short by default (make test); RELAY_TEST_HEAVY=1 is the full run (make test-sinks).
func TestSinkFaults(t *testing.T) {
	kills, outage, pause := 2, 3*time.Second, 10*time.Millisecond
	if full {
		kills, outage, pause = 5, 10*time.Second, 3*time.Millisecond
	}
	db := pgtest.NewDB(t)
	ns := startNATS(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ep := &killableEndpoint{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	ep.open(t)
	defer func() { ep.shut() }()

	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: hook
    match: { event_types: ["fault.*"] }
    webhook: { url: "http://%s/events", secret_env: FAULT_WEBHOOK_SECRET, timeout: 2s }
  - name: bus
    match: { event_types: ["fault.*"] }
    nats: { url: "%s", stream: OUTBOX, subject: "outbox.{aggregate_type}.{event_type}", timeout: 2s }
  - name: kafka
    match: { event_types: ["fault.*"] }
    kafka: { brokers: ["%s"], topic: "outbox.event.{aggregate_type}", timeout: 3s }
`, ep.addr, ns.url(), kc.ListenAddrs()[0])), 0o600)
	env := []string{"FAULT_WEBHOOK_SECRET=" + secret}
	args := []string{"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication, "--status-interval", "200ms",
		"--heartbeat-interval", "1s", "--workers", "1", "--sinks", file}
	p := relaytest.Start(t, env, args...)

	// The load: one producer, so that the order of its commits is known.
	var mu sync.Mutex
	var committed, rolledBack []string
	aggOf := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			var msgs []outbox.Message
			for j := range 1 + rand.IntN(3) {
				msgs = append(msgs, outbox.Message{AggregateType: "order", AggregateID: fmt.Sprintf("a-%d", (i+j)%8),
					EventType: "fault.event", Payload: map[string]int{"i": i}})
			}
			if err := outbox.Write(ctx, tx, msgs...); err != nil {
				t.Error(err)
				return
			}
			rollback := rand.IntN(10) == 0
			mu.Lock()
			if rollback {
				tx.Rollback(ctx)
				for _, m := range msgs {
					rolledBack = append(rolledBack, m.ID.String())
				}
			} else if err := tx.Commit(ctx); err == nil {
				for j, m := range msgs {
					committed = append(committed, m.ID.String())
					aggOf[m.ID.String()] = (i + j) % 8
				}
			}
			mu.Unlock()
			time.Sleep(pause)
		}
	}()

	for k := range kills {
		time.Sleep(time.Duration(1000+rand.IntN(1500)) * time.Millisecond)
		switch k {
		case 0:
			t.Logf("kill -9 nats-server for %s", outage)
			ns.kill()
			time.Sleep(outage)
			ns.start(t)
		case 1:
			t.Logf("webhook endpoint down for %s", outage)
			ep.shut()
			time.Sleep(outage)
			ep.open(t)
		}
		t.Logf("kill -9 relay (%d of %d)", k+1, kills)
		p.Kill()
		p = relaytest.Start(t, env, args...)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	kcl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer kcl.Close()
	readers := map[string]func() []string{
		"hook":  ep.received,
		"bus":   (&natsReader{url: ns.url(), stream: "OUTBOX"}).read,
		"kafka": (&kafkaReader{cl: kcl}).read,
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[string][]string{}
	deadline := time.Now().Add(3 * time.Minute)
	for name, read := range readers {
		for {
			got[name] = read()
			if len(firstSeen(got[name])) >= len(committed) && count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = $1`, name) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sink %s: %d of %d committed events delivered, %d parked after 3 minutes\n%s", name,
					len(firstSeen(got[name])), len(committed), count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = $1`, name), tail(p.Output()))
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	p.Stop(60 * time.Second)

	isCommitted := map[string]int{}
	for i, id := range committed {
		isCommitted[id] = i
	}
	for name, ids := range got {
		pos := firstSeen(ids)
		for _, id := range rolledBack {
			if _, ok := pos[id]; ok {
				t.Errorf("sink %s: rolled-back event %s was delivered", name, id)
			}
		}
		distinct := 0
		for id := range pos {
			if _, ok := isCommitted[id]; ok {
				distinct++
			} else if !contains(rolledBack, id) {
				t.Errorf("sink %s: delivered unknown id %q", name, id)
			}
		}
		if distinct != len(committed) {
			t.Errorf("sink %s: %d distinct committed ids delivered, want %d", name, distinct, len(committed))
		}
		last := map[int]int{}
		for _, id := range committed {
			a := aggOf[id]
			if prev, ok := last[a]; ok && pos[id] < prev {
				t.Errorf("sink %s: aggregate a-%d: event %s first delivered before an event committed earlier", name, a, id)
				break
			}
			last[a] = pos[id]
		}
		t.Logf("sink %s: %d committed (%d rolled back), %d deliveries, %d duplicates", name, len(committed), len(rolledBack),
			len(ids), len(ids)-len(pos))
	}
	if ep.bad > 0 {
		t.Errorf("%d webhook requests with a bad signature", ep.bad)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
