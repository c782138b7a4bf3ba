package relay_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/test/pgtest"
)

// publicStartNamespace is the namespace of start ids (saga/admin): public,
// as everything in the source is.
var publicStartNamespace = uuid.MustParse("6f1c2a0e-5b7d-4f43-9d8e-2a64c1f0b7a1")

// A hand-started saga's trigger id is one tenant A cannot compute: A writes
// events under every id it could derive for tenant B's key (the public
// namespace with the saga, B and the key, with and without length
// prefixes, for B and for itself; of the trigger's type and another), and B's
// start still writes its own event and starts its own instance, and a
// repeat names that instance. Where an id is taken all the same (a leaked
// id, written first by A), B's start answers 409 and names nothing of A's.
func TestHandStartIsTheTenantsOwn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE relay_test_steps (order_id text, step text)`); err != nil {
		t.Fatal(err)
	}
	tenantA, tenantB := uuid.New(), uuid.New()
	tokA, tokB := randomToken(), randomToken()
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	digest := func(tok string) string { sum := sha256.Sum256([]byte(tok)); return hex.EncodeToString(sum[:]) }
	if err := os.WriteFile(file, []byte(fmt.Sprintf("tokens:\n"+
		"  - {name: tenant-a, sha256: %s, tenant: %s, role: operate}\n"+
		"  - {name: tenant-b, sha256: %s, tenant: %s, role: operate}\n",
		digest(tokA), tenantA, digest(tokB), tenantB)), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: orderRegistry(t), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond, HTTPAddr: "127.0.0.1:0", APITokensFile: file,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(t.Context()) })

	post := func(tok, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type result struct {
		EventID    uuid.UUID  `json:"event_id"`
		Created    bool       `json:"created"`
		InstanceID *uuid.UUID `json:"instance_id"`
	}
	start := func(tok, key, order string) (int, result, string) {
		t.Helper()
		code, body := post(tok, "/v1/sagas", fmt.Sprintf(`{"saga": "order", "payload": {"order_id": %q}, "idempotency_key": %q}`, order, key))
		var res result
		if code < 300 {
			if err := json.Unmarshal([]byte(body), &res); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
		}
		return code, res, body
	}
	instanceOf := func(eventID uuid.UUID) (uuid.UUID, uuid.UUID) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var id, tenant uuid.UUID
			if err := db.Pool.QueryRow(ctx, `SELECT id, tenant_id FROM saga_instances WHERE trigger_event_id = $1 AND saga_name = 'order'`,
				eventID).Scan(&id, &tenant); err == nil {
				return id, tenant
			}
			if time.Now().After(end) {
				t.Fatalf("no instance of order for event %s after 30s", eventID)
			}
		}
	}

	// A writes under every id it can derive for B's key order-1002.
	lenPrefixed := func(fields ...string) []byte {
		var b []byte
		for _, f := range fields {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
		return b
	}
	var forged []uuid.UUID
	for _, tenant := range []uuid.UUID{tenantB, tenantA, uuid.Nil} {
		forged = append(forged,
			uuid.NewSHA1(publicStartNamespace, []byte("order\x00"+tenant.String()+"\x00order-1002")),
			uuid.NewSHA1(publicStartNamespace, lenPrefixed("order", tenant.String(), "order-1002")),
			uuid.NewSHA1(uuid.NameSpaceURL, []byte("order\x00"+tenant.String()+"\x00order-1002")))
	}
	for i, id := range forged {
		eventType := "order.placed"
		if i%2 == 1 {
			eventType = "order.noise"
		}
		code, body := post(tokA, "/v1/events", fmt.Sprintf(`{"id": %q, "event_type": %q, "payload": {"order_id": "forged-%d"}}`, id, eventType, i))
		if code != http.StatusCreated {
			t.Fatalf("tenant A's event %s: %d %s", id, code, body)
		}
	}
	aInstance, _ := instanceOf(forged[0]) // the id B's start had before: A's instance stands there
	code, first, body := start(tokB, "order-1002", "o-1002")
	if code != http.StatusAccepted || !first.Created || first.InstanceID != nil {
		t.Fatalf("tenant B's start beside A's forged events: %d %s, want 202 with a new event", code, body)
	}
	for _, id := range forged {
		if first.EventID == id {
			t.Fatalf("B's start was given id %s, which tenant A computed", id)
		}
	}
	bInstance, bTenant := instanceOf(first.EventID)
	if bTenant != tenantB || bInstance == aInstance {
		t.Fatalf("B's start made instance %s of tenant %s", bInstance, bTenant)
	}
	code, again, body := start(tokB, "order-1002", "o-1002")
	if code != http.StatusOK || again.Created || again.EventID != first.EventID || again.InstanceID == nil || *again.InstanceID != bInstance {
		t.Fatalf("B's start repeated: %d %s, want 200 naming B's instance %s", code, body, bInstance)
	}
	// A's start with the same key is A's own: another event, another
	// instance, nothing of B's in the answer.
	code, aStart, body := start(tokA, "order-1002", "a-1002")
	if code != http.StatusAccepted || aStart.EventID == first.EventID || strings.Contains(body, bInstance.String()) {
		t.Fatalf("A's start with B's key: %d %s, want 202 with an event of its own", code, body)
	}

	// A start written before the secret existed, under the public id, is
	// still the key's when it is B's own and of the trigger's type.
	legacy := uuid.NewSHA1(publicStartNamespace, []byte("order\x00"+tenantB.String()+"\x00order-1005"))
	if code, body := post(tokB, "/v1/events", fmt.Sprintf(`{"id": %q, "event_type": "order.placed", "payload": {"order_id": "o-1005"}}`, legacy)); code != http.StatusCreated {
		t.Fatalf("B's start under the public id: %d %s", code, body)
	}
	legacyInstance, _ := instanceOf(legacy)
	if code, res, body := start(tokB, "order-1005", "o-1005"); code != http.StatusOK || res.EventID != legacy || res.InstanceID == nil || *res.InstanceID != legacyInstance {
		t.Fatalf("B's key order-1005, started under the public id: %d %s, want 200 naming instance %s", code, body, legacyInstance)
	}

	// A leaked id: A writes first under the id B's key order-1003 will
	// have. B's start is refused, and learns nothing of A's event or
	// instance; with A's row gone (retention), A's instance still refuses it.
	var secret []byte
	if err := db.Pool.QueryRow(ctx, `SELECT secret FROM relay_secrets WHERE name = 'start_id'`).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	leaked := uuid.NewSHA1(publicStartNamespace, append(append([]byte(nil), secret...), lenPrefixed("order", tenantB.String(), "order-1003")...))
	if code, body := post(tokA, "/v1/events", fmt.Sprintf(`{"id": %q, "event_type": "order.placed", "payload": {"order_id": "leaked"}}`, leaked)); code != http.StatusCreated {
		t.Fatalf("tenant A's event under the leaked id: %d %s", code, body)
	}
	leakedInstance, _ := instanceOf(leaked)
	for _, phase := range []string{"with A's event", "with A's event gone"} {
		code, _, body = start(tokB, "order-1003", "o-1003")
		if code != http.StatusConflict || !strings.Contains(body, "order-1003") {
			t.Fatalf("B's start %s under its leaked id: %d %s, want 409", phase, code, body)
		}
		for _, foreign := range []string{leaked.String(), leakedInstance.String(), tenantA.String()} {
			if strings.Contains(body, foreign) {
				t.Fatalf("B's 409 %s names %s of tenant A: %s", phase, foreign, body)
			}
		}
		if _, err := db.Pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, leaked); err != nil {
			t.Fatal(err)
		}
	}
	// Another event type under the id: also not this start.
	leaked4 := uuid.NewSHA1(publicStartNamespace, append(append([]byte(nil), secret...), lenPrefixed("order", tenantB.String(), "order-1004")...))
	if code, body := post(tokB, "/v1/events", fmt.Sprintf(`{"id": %q, "event_type": "order.noise", "payload": {}}`, leaked4)); code != http.StatusCreated {
		t.Fatalf("an event of another type: %d %s", code, body)
	}
	if code, _, body := start(tokB, "order-1004", "o-1004"); code != http.StatusConflict || strings.Contains(body, leaked4.String()) {
		t.Fatalf("a start whose id holds an event of another type: %d %s, want 409", code, body)
	}
}

func randomToken() string {
	raw := make([]byte, 24)
	rand.Read(raw)
	return hex.EncodeToString(raw)
}
