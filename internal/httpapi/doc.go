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
package httpapi
