// Package httpapi is the relay's monitor: the JSON API under /v1 (sagas,
// stuck instances, manual retry and cancel, replication), /metrics for
// Prometheus, /healthz and /readyz, and a server-rendered web page for the
// people on call at /.
//
// Every saga request goes through saga/admin, the same code the `relay
// sagas` CLI uses, so the API, the page and the CLI cannot disagree.
//
// It promises:
//
//   - With an API token configured, every /v1 request needs
//     "Authorization: Bearer <token>" (compared in constant time) or the
//     page's session cookie, else 401. Without a token, reads are open and
//     retry and cancel answer 403: a deployment that forgot the token cannot
//     be pushed around. /metrics, /healthz and /readyz are always open.
//   - X-Tenant-ID restricts every /v1 read and write to that tenant; another
//     tenant's instance is 404, like one that does not exist.
//   - Errors are JSON {"error": "..."} with the status of their kind:
//     invalid input 400, unknown 404, a conflict with the instance's state
//     409. Errors without a kind are logged and answered with a generic 500,
//     so database details never reach a caller.
//   - Neither the token nor the DSN is ever logged or rendered.
//   - The page writes every value it shows (saga names, errors, outputs)
//     as escaped text or quoted attributes, and has no inline script or
//     style: its Content-Security-Policy refuses them.
//   - Without a token, only requests whose Host is an IP literal,
//     localhost or a Config.AllowedHosts name are answered (403 otherwise),
//     so that DNS rebinding cannot read through an operator's browser;
//     /metrics, /healthz and /readyz answer any Host.
//   - The page's sessions are random server-side ids that expire after
//     Config.SessionTTL and die at logout; the cookie is
//     __Host-compensa_session and Secure behind TLS (or SecureCookies).
//   - Failed authentications are logged (address, route, never the
//     credential) and, past Config.AuthFailures a window from one address,
//     answered 429 with Retry-After.
//   - Monitoring never starves the work: a scrape reads counted gauges
//     from memory (refreshed in the background), /readyz answers from a
//     check at most ReadinessMaxAge old, /v1 and page requests and scrapes
//     are bounded in number and pace, and NewHTTPServer and Listen bound
//     every connection's time and their count.
//   - Parameters with invalid UTF-8 or NUL, an empty or repeated
//     X-Tenant-ID, and a reason with control characters are 400.
package httpapi
