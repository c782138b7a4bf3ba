package sink

import "strings"

// reservedHeaders are the header names, in normalised form (see
// normalHeader), that only the relay sets: the row's own fields, the
// signature and framing of a webhook request, hop-by-hop headers, those a
// proxy sets to say where a request came from, and those a framework or a
// proxy reads to change the method or the path, or to wait (Expect).
var reservedHeaders = map[string]bool{
	"event-type": true, "aggregate-type": true, "aggregate-id": true, "tenant-id": true,
	"correlation-id": true, "causation-id": true, "poison": true,
	"content-type": true, "content-length": true, "content-encoding": true, "transfer-encoding": true,
	"host": true, "authorization": true, "cookie": true, "expect": true,
	"connection": true, "keep-alive": true, "te": true, "trailer": true, "trailers": true, "upgrade": true,
	"forwarded": true, "x-real-ip": true, "via": true,
	"x-http-method": true, "x-http-method-override": true, "x-method-override": true,
	"x-original-url": true, "x-rewrite-url": true, "x-original-uri": true, "x-original-host": true,
	"true-client-ip": true, "cf-connecting-ip": true, "x-client-ip": true, "x-cluster-client-ip": true,
	"fastly-client-ip": true, "x-azure-clientip": true, "x-appengine-user-ip": true,
}

// reservedPrefixes: every name that starts with one of these is reserved.
var reservedPrefixes = []string{"webhook-", "x-forwarded-", "proxy-", "x-envoy-", "cf-"}

// normalHeader is the form in which header names are compared: lower case,
// '_' as '-', so that TENANT_ID, Tenant-Id and tenant_id are one name (an
// HTTP header, a NATS header and a Kafka header each fold case or
// underscores differently on the way to a consumer).
func normalHeader(k string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(k)), "_", "-")
}

// ReservedHeader reports whether k names a header that a row's headers
// object may not set, in any sink: compared case-insensitively, with '-'
// and '_' alike.
func ReservedHeader(k string) bool {
	n := normalHeader(k)
	if reservedHeaders[n] {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}
