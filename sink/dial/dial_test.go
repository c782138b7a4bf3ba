package dial_test

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/dial"
	"github.com/compensa/compensa/sink/rabbitsink"
	"github.com/compensa/compensa/sink/redissink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const brokersFile = `sinks:
  - name: rabbit
    rabbitmq: { url: "amqp://relay@127.0.0.1:1/", password_env: DIAL_RABBIT_PASSWORD, exchange: outbox }
  - name: streams
    redis: { url: "redis://127.0.0.1:1/0", password_env: DIAL_REDIS_PASSWORD }
`

// A password_env that is not set is refused before anything connects,
// naming the variable; once set, Open builds both sinks without a broker
// running (they connect on the first delivery).
func TestBrokerPasswordsFromTheEnvironment(t *testing.T) {
	cfg, err := sink.Parse("s.yaml", []byte(brokersFile))
	if err != nil {
		t.Fatal(err)
	}
	err = dial.Check(cfg, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "DIAL_RABBIT_PASSWORD (password_env) is not set") ||
		!strings.Contains(err.Error(), "DIAL_REDIS_PASSWORD (password_env) is not set") || !strings.Contains(err.Error(), "s.yaml:2") {
		t.Fatalf("Check: %v", err)
	}
	env := map[string]string{"DIAL_RABBIT_PASSWORD": "p1-secret", "DIAL_REDIS_PASSWORD": "p2-secret"}
	if err := dial.Check(cfg, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	ds, err := dial.Open(cfg, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	defer dial.Close(ds)
	if _, ok := ds[0].Sink.(*rabbitsink.Sink); !ok || ds[0].Spec.Kind() != "rabbitmq" {
		t.Errorf("first sink: %T %s", ds[0].Sink, ds[0].Spec.Kind())
	}
	if _, ok := ds[1].Sink.(*redissink.Sink); !ok || ds[1].Spec.Kind() != "redis" {
		t.Errorf("second sink: %T %s", ds[1].Sink, ds[1].Spec.Kind())
	}
	// Nothing listens on port 1: the deliveries fail as outages, and no
	// error holds a password.
	for _, d := range ds {
		for _, err := range d.Sink.Deliver(t.Context(), []*sink.Event{{ID: "1", EventType: "e"}}) {
			if err == nil || sink.Classify(err) != "down" || strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: %v", d.Spec.Name, err)
			}
		}
	}
}
