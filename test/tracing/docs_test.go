package tracing

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/compensa/compensa/test/pgtest"
)

// TestDocPlainSQLTraceContext runs the plain-SQL insert docs/producers.md shows
// for producers in other languages: the row's headers get traceparent, and
// a tracestate the propagator did not set is left out (not null).
func TestDocPlainSQLTraceContext(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "producers.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "\n## Trace context\n")
	if i < 0 {
		t.Fatal("docs/producers.md has no \"## Trace context\" section")
	}
	j := strings.Index(readme[i:], "```sql\n")
	k := strings.Index(readme[i+j+7:], "```")
	if j < 0 || k < 0 {
		t.Fatal("no sql block in docs/producers.md's trace context section")
	}
	stmt := readme[i+j+7 : i+j+7+k]
	db := pgtest.NewDB(t)
	ctx := context.Background()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, err := db.Pool.Exec(ctx, stmt, "o-1", `{"total": 1}`, tp, nil); err != nil {
		t.Fatalf("docs/producers.md's statement: %v\n%s", err, stmt)
	}
	var headers string
	if err := db.Pool.QueryRow(ctx, `SELECT headers::text FROM outbox WHERE aggregate_id = 'o-1'`).Scan(&headers); err != nil {
		t.Fatal(err)
	}
	if headers != `{"traceparent": "`+tp+`"}` {
		t.Fatalf("headers %s", headers)
	}
}
