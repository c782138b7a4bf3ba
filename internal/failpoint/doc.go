// Package failpoint holds the relay's test-only fault injection. The real
// injection is compiled in only with `-tags failpoint` (the test harnesses build
// the binary that way); a release build links the no-op in failpoint_off.go, so
// RELAY_FAILPOINT means nothing to a production relay.
package failpoint
