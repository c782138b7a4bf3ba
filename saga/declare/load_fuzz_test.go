package declare

import (
	"os"
	"strings"
	"testing"

	"github.com/compensa/compensa/saga"
)

// FuzzLoadFile: arbitrary bytes give problems or a valid definition, never
// a panic; a valid one registers with the runner's registry, and every
// problem is placed and says how to fix it.
func FuzzLoadFile(f *testing.F) {
	if b, err := os.ReadFile("testdata/valid/order_fulfilment.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(head + "steps:\n  - name: a\n    emit: [{event_type: x, payload: \"${ trigger.payload }\"}]\n"))
	f.Add([]byte(head + "steps:\n  - name: a\n    sql: {query: \"select $1\", params: [\"${ steps.a.x }\"]}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("saga: s\nversion: 1\n---\nsaga: t\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, probs := LoadFile("f.yaml", b, Options{})
		if s == nil {
			if len(probs) == 0 {
				t.Fatal("no saga and no problem")
			}
			for _, p := range probs {
				if !strings.Contains(p.Msg, "; ") {
					t.Fatalf("a problem that does not say how to fix it: %s", p)
				}
			}
			return
		}
		if len(probs) != 0 {
			t.Fatalf("a saga and problems: %v", probs)
		}
		if err := saga.NewRegistry().Register(s.Definition(nil)); err != nil {
			t.Fatalf("a loaded saga the registry refuses: %v", err)
		}
	})
}
