package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs `relay <args>` in process and returns its output and exit code.
func runDeclaredCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	root := newRootCmd(&rootOptions{})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err == nil {
		return out.String(), 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return out.String() + "relay: " + ee.msg + "\n", ee.code
	}
	return out.String() + "relay: " + err.Error() + "\n", 1
}

const exampleSaga = "../../examples/orders/sagas/order_fulfilment.yaml"

// TestSagasTestWalksTheExample checks `relay sagas test` on the orders
// example: the forward path, the compensations of --fail in reverse order,
// and an expression that cannot be evaluated.
func TestSagasTestWalksTheExample(t *testing.T) {
	t.Parallel()
	trigger := "../../examples/orders/trigger.json"
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"forward", []string{"--rows", `reserve_stock=[{"sku":"apple"}]`, "--response", `charge_payment={"id":"ch_1"}`, "--reply", `ship={"ok":true,"tracking":"TRK-1"}`, "--rows", "confirm=1", "--expect", "COMPLETED"}, 0, `order_fulfilment v1 (../../examples/orders/sagas/order_fulfilment.yaml), trigger order.placed

1. reserve_stock (sql)
   sql: UPDATE stock SET reserved = reserved + $1 WHERE sku = $2 AND on_hand - reserved >= $1 RETURNING sku
   $1 = 2
   $2 = "apple"
   result: 1 row(s) [{"sku":"apple"}] (expect one_row)
   output: {"sku":"apple"}

2. charge_payment (http)
   POST http://127.0.0.1:8099/charges
   Authorization: Bearer <secret PAYMENTS_TOKEN>
   Idempotency-Key: <instance id>:charge_payment
   body: {"cents":1250,"order_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01"}
   response: {"body":{"id":"ch_1"},"headers":{},"status":200}
   output: {"charge_id":"ch_1"}

3. ship (command)
   command: {"aggregate_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","aggregate_type":"order","event_type":"shipping.requested","payload":{"order_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","qty":2,"sku":"apple"}} (its id is the step's command id), then waits up to 30s for the reply
   reply: {"ok":true,"tracking":"TRK-1"}
   output: {"tracking":"TRK-1"}

4. confirm (sql)
   sql: UPDATE orders SET status = 'CONFIRMED', tracking = $2 WHERE id = $1::uuid
   $1 = "7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01"
   $2 = "TRK-1"
   result: 1 row(s) affected (expect one_row)
   emit: {"aggregate_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","aggregate_type":"order","event_type":"order.confirmed","payload":{"order_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","tracking":"TRK-1"}}

COMPLETED
`},
		{"fail confirm", []string{"--rows", `reserve_stock=[{"sku":"apple"}]`, "--response", `charge_payment={"status":201,"body":{"id":"ch_9"}}`, "--reply", `ship={"ok":true,"tracking":"TRK-1"}`, "--fail", "confirm"}, 0, `order_fulfilment v1 (../../examples/orders/sagas/order_fulfilment.yaml), trigger order.placed

1. reserve_stock (sql)
   sql: UPDATE stock SET reserved = reserved + $1 WHERE sku = $2 AND on_hand - reserved >= $1 RETURNING sku
   $1 = 2
   $2 = "apple"
   result: 1 row(s) [{"sku":"apple"}] (expect one_row)
   output: {"sku":"apple"}

2. charge_payment (http)
   POST http://127.0.0.1:8099/charges
   Authorization: Bearer <secret PAYMENTS_TOKEN>
   Idempotency-Key: <instance id>:charge_payment
   body: {"cents":1250,"order_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01"}
   response: {"body":{"id":"ch_9"},"headers":{},"status":201}
   output: {"charge_id":"ch_9"}

3. ship (command)
   command: {"aggregate_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","aggregate_type":"order","event_type":"shipping.requested","payload":{"order_id":"7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01","qty":2,"sku":"apple"}} (its id is the step's command id), then waits up to 30s for the reply
   reply: {"ok":true,"tracking":"TRK-1"}
   output: {"tracking":"TRK-1"}

4. confirm (sql)
   sql: UPDATE orders SET status = 'CONFIRMED', tracking = $2 WHERE id = $1::uuid
   $1 = "7d9f1c3e-5b2a-4c61-9e0f-2a6b8d4c1e01"
   $2 = "TRK-1"
   result: 0 row(s) [] (expect one_row)
   FAILS: sql expected one row, got 0
   the saga compensates the steps before it, newest first

compensate 3. ship: nothing to undo (no compensate)

compensate 2. charge_payment (http)
   POST http://127.0.0.1:8099/refunds
   Authorization: Bearer <secret PAYMENTS_TOKEN>
   Idempotency-Key: <instance id>:charge_payment:compensate
   body: {"charge_key":"<instance id>:charge_payment"}

compensate 1. reserve_stock (sql)
   sql: UPDATE stock SET reserved = reserved - $1 WHERE sku = $2
   $1 = 2
   $2 = "apple"

COMPENSATED
`},
		{"no rows: the step fails at its expect", []string{"--expect", "COMPLETED"}, 1, "relay: --expect COMPLETED, but the saga ends COMPENSATED: step reserve_stock failed: sql expected one row, got 0\n"},
		{"a failing expression fails the step", []string{"--rows", `reserve_stock=[{"name":"apple"}]`, "--expect", "COMPLETED"}, 1, "relay: --expect COMPLETED, but the saga ends COMPENSATED: step reserve_stock failed: ../../examples/orders/sagas/order_fulfilment.yaml:24:23: expression ${ result.rows[0].sku } failed: no such key: sku\n"},
		{"an http status compensates", []string{"--rows", `reserve_stock=[{"sku":"apple"}]`, "--response", `charge_payment=422:{"error":"declined"}`, "--expect", "COMPLETED"}, 1, "relay: --expect COMPLETED, but the saga ends COMPENSATED: step charge_payment failed: http POST answered 422 {\"error\":\"declined\"}\n"},
		{"a 5xx may have acted: its compensation runs too", []string{"--rows", `reserve_stock=[{"sku":"apple"}]`, "--response", `charge_payment=503:`, "--expect", "COMPLETED"}, 1, "relay: --expect COMPLETED, but the saga ends COMPENSATED: step charge_payment failed: http POST answered 503, and every retry alike\n"},
		{"unknown step", []string{"--fail", "pack"}, 1, "relay: --fail pack: the saga has no such step; use one of: reserve_stock, charge_payment, ship, confirm\n"},
		{"bad reply flag", []string{"--rows", "reserve_stock"}, 2, "relay: invalid value \"reserve_stock\" for --rows of \"relay sagas test\": want STEP=JSON, e.g. --rows ship='{\"tracking\": \"T1\"}'\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code := runDeclaredCLI(t, append([]string{"sagas", "test", exampleSaga, "--trigger", trigger}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if tc.code == 1 && strings.HasPrefix(tc.want, "relay:") {
				// The walk printed the steps it got through first.
				if i := strings.LastIndex(out, "relay: "); i >= 0 {
					out = out[i:]
				}
			}
			if out != tc.want {
				t.Errorf("output:\n%s\nwant:\n%s", out, tc.want)
			}
		})
	}
}

// TestSagasValidate: a valid directory prints one line per saga; a broken
// one prints every problem and exits 2.
func TestSagasValidate(t *testing.T) {
	t.Parallel()
	out, code := runDeclaredCLI(t, "sagas", "validate", "../../examples/orders/sagas")
	want := "order_fulfilment v1  triggers: order.placed  steps: reserve_stock (sql, compensate sql) → charge_payment (http, compensate http) → ship (command) → confirm (sql)\n" +
		"../../examples/orders/sagas/order_fulfilment.test.yaml: 5 test case(s) for order_fulfilment (run them with relay sagas test ../../examples/orders/sagas)\n"
	if code != 0 || out != want {
		t.Fatalf("exit %d:\n%s\nwant:\n%s", code, out, want)
	}
	out, code = runDeclaredCLI(t, "sagas", "validate", "../../saga/declare/testdata")
	if code != 2 || !strings.Contains(out, "no *.yaml or *.yml file in the saga directory") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// TestSagasTestRunsTestFiles: `relay sagas test DIR` runs the example's
// test files and passes; a deliberately wrong expectation fails with what
// differs; a broken test file is reported at file:line:col, by validate too.
func TestSagasTestRunsTestFiles(t *testing.T) {
	t.Parallel()
	out, code := runDeclaredCLI(t, "sagas", "test", "../../examples/orders/sagas")
	if code != 0 || !strings.Contains(out, "5 passed, 0 failed") {
		t.Fatalf("the example's test files: exit %d\n%s", code, out)
	}

	dir := t.TempDir()
	for _, f := range []string{"order_fulfilment.yaml", "order_fulfilment.test.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../examples/orders/sagas", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "order_fulfilment.test.yaml" {
			b = []byte(strings.Replace(strings.ReplaceAll(string(b), "../trigger.json", "../../examples/orders/trigger.json"),
				"      compensations: [charge_payment, reserve_stock]\n", "      compensations: [reserve_stock]\n", 1))
			b = []byte(strings.ReplaceAll(string(b), "../../examples/orders/trigger.json", mustAbs(t, "../../examples/orders/trigger.json")))
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, code = runDeclaredCLI(t, "sagas", "test", dir)
	if code != 1 || !strings.Contains(out, "4 passed, 1 failed") ||
		!strings.Contains(out, "FAIL "+filepath.Join(dir, "order_fulfilment.test.yaml")+":37:5 a charge that timed out after acting is refunded by its key") ||
		!strings.Contains(out, "compensations: want [reserve_stock], got [charge_payment, reserve_stock]") ||
		!strings.Contains(out, "the walk:") {
		t.Errorf("a wrong expectation: exit %d\n%s", code, out)
	}

	bad := "saga: order_fulfilment\ncases:\n  - name: x\n    trigger: {payload: {}}\n    expect: {status: DONE}\n    rowz: {}\n"
	if err := os.WriteFile(filepath.Join(dir, "order_fulfilment.test.yaml"), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"test", "validate"} {
		out, code = runDeclaredCLI(t, "sagas", verb, dir)
		f := filepath.Join(dir, "order_fulfilment.test.yaml")
		if code != 2 || !strings.Contains(out, f+`:6:5: unknown key "rowz" in cases[0]; did you mean "rows"?`) ||
			!strings.Contains(out, f+":5:22: cases[0].expect.status is DONE; use one of: COMPLETED, COMPENSATED, FAILED, FILTERED, DEAD_LETTER") {
			t.Errorf("sagas %s of a broken test file: exit %d\n%s", verb, code, out)
		}
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestSagasValidateWarnsOfExpressionHosts: an http step whose host comes
// from an expression in a file without egress.allow is a warning (exit 0);
// a bad allow entry is a problem with its place (exit 2).
func TestSagasValidateWarnsOfExpressionHosts(t *testing.T) {
	t.Parallel()
	write := func(body string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "cb.yaml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	const open = "saga: cb\nversion: 1\ntriggers: [{event_type: e}]\nsteps:\n  - name: call\n    http: {method: POST, url: \"${ raw(trigger.payload.callback) }\"}\n"
	dir := write(open)
	out, code := runDeclaredCLI(t, "sagas", "validate", dir)
	if code != 0 || !strings.Contains(out, filepath.Join(dir, "cb.yaml")+":6:31: warning: step call builds the host of its http.url from an expression and the file has no egress.allow") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	out, code = runDeclaredCLI(t, "sagas", "validate", write(strings.Replace(open, "steps:", "egress: {allow: [hooks.internal]}\nsteps:", 1)))
	if code != 0 || strings.Contains(out, "warning") {
		t.Errorf("with an allow list: exit %d:\n%s", code, out)
	}
	dir = write(strings.Replace(open, "steps:", "egress: {allow: [\"10.0.0.0/40\"]}\nsteps:", 1))
	out, code = runDeclaredCLI(t, "sagas", "validate", dir)
	if code != 2 || !strings.Contains(out, filepath.Join(dir, "cb.yaml")+`:4:18: egress.allow: "10.0.0.0/40" is neither`) {
		t.Errorf("a bad allow entry: exit %d:\n%s", code, out)
	}
}
