package relay_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// TestAPIKnowsStoredDefinitions: a relay run without --sagas answers
// GET /v1/sagas/{id} for a declared instance with the steps of the body some
// relay stored, and does not call it unregistered.
func TestAPIKnowsStoredDefinitions(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	body, err := os.ReadFile(filepath.Join("..", "examples", "orders", "sagas", "order_fulfilment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, probs := declare.LoadFile("order_fulfilment.yaml", body, declare.Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	if _, err := declare.Pin(ctx, db.Pool, []*declare.Saga{s}); err != nil {
		t.Fatal(err)
	}
	j, err := pgjournal.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	if err := j.Enqueue(ctx, saga.Instance{ID: id, TenantID: uuid.New(), SagaName: s.Name, SagaVersion: s.Version,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{"trigger":{},"steps":{}}`)}); err != nil {
		t.Fatal(err)
	}

	raw := make([]byte, 24)
	rand.Read(raw)
	token := hex.EncodeToString(raw)
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", NoStream: true, Workers: 1, APIToken: token,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(t.Context()) })

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Addr()+"/v1/sagas/"+id.String(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Registered bool `json:"registered"`
		Steps      []struct {
			Name string `json:"name"`
		} `json:"steps"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/sagas/%s: %d", id, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if !got.Registered {
		t.Errorf("the API calls a stored declared definition unregistered")
	}
	var names []string
	for _, st := range got.Steps {
		names = append(names, st.Name)
	}
	if len(names) != 4 || names[0] != "reserve_stock" || names[3] != "confirm" {
		t.Errorf("steps = %v, want the stored body's four steps", names)
	}
}
