// Package declare loads sagas declared in YAML files with CEL expressions
// (`relay run --sagas DIR`) and turns them into ordinary saga.Definitions:
// the runner never sees YAML or CEL, and package saga does not import this
// one.
//
// It promises:
//
//   - Nothing half-loaded: LoadDir checks every file (YAML syntax, the JSON
//     Schema in saga.schema.json, which it validates against itself, then
//     step names, scopes and every ${ … } expression, compiled and
//     type-checked by CEL) and returns either a valid set or every problem
//     at once, each as `file:line:col: what is wrong; how to fix it`, the
//     column inside an expression included.
//   - Scopes are checked at load: steps.X names an earlier step (a
//     compensation may read its own step), result/response/reply only after
//     the step's own sql/http/command, secrets only in http.url and
//     http.headers. At run time a missing field is an error naming the
//     expression and its file:line:col, never a silent null; evaluation has
//     a cost limit.
//   - SQL text is never built from expressions: values reach PostgreSQL only
//     as parameters (whole numbers as integers, maps and lists as jsonb).
//   - Secrets (RELAY_SECRET_<NAME>) exist only in the request they
//     authorise: they are not in the state, the outputs, the journal or the
//     logs, and error messages have them replaced by <secret NAME>.
//   - Versions are pinned (Pin): the first load of (name, version) stores its
//     body and the hash of its canonical form (saga_definitions); a changed
//     body under a stored version is refused; instances keep running their
//     stored version after the file changed or was removed.
//   - An http step carries Idempotency-Key <instance id>:<step> (…:compensate
//     for its compensation), the same on every attempt; 2xx succeeds, 408,
//     429, 5xx and no answer are retried and count as "may have acted"
//     (saga.MayHaveActed), other 4xx fail for good; Retry-After is honoured
//     (saga.RetryAfter).
//
// Walk evaluates a definition against a sample trigger without a database or
// network (`relay sagas test`).
package declare
