package sink

import "testing"

// A row's headers never set what the relay, a proxy or a framework reads to
// frame, route, authorise or attribute a request; other names pass.
func TestReservedHeader(t *testing.T) {
	t.Parallel()
	for _, k := range []string{
		"Authorization", "Host", "Expect", "Content-Length", "tenant_id", "Webhook-Signature",
		"X-HTTP-Method-Override", "x_http_method", "X-Method-Override", "X-Original-URL", "X-Rewrite-URL",
		"True-Client-IP", "CF-Connecting-IP", "CF-Ray", "X-Client-IP", "Fastly-Client-IP", "X-Real-IP",
		"X-Forwarded-For", "X-Envoy-Original-Path", "Proxy-Authorization",
	} {
		if !ReservedHeader(k) {
			t.Errorf("%s is not reserved", k)
		}
	}
	for _, k := range []string{"X-Request-Source", "Order-Priority", "traceparent", "X-Customer"} {
		if ReservedHeader(k) {
			t.Errorf("%s is reserved", k)
		}
	}
}
