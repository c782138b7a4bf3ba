// Package chaos is the fault suite behind `make chaos` and RELIABILITY.md: it
// drives the real `relay` binary as separate processes against a real
// PostgreSQL while a producer commits research briefs through application
// transactions, injects faults (SIGKILL, SIGSTOP past the lease, immediate
// database restarts, terminated walsenders, dropped and invalidated slots,
// hostile input) and accounts for every trigger event the way Jepsen's
// total-queue checker does: each one is lost, duplicated, unexpected or fine.
//
// The scenarios are tests behind the `chaos` build tag, so that `go test
// ./...` does not run them; `make chaos` (QUICK=1 for the short CI run) runs
// them in order and prints each scenario's figures:
//
//	go test -tags chaos -count=1 -v -timeout 90m ./test/chaos                     # the short run
//	RELAY_TEST_HEAVY=1 go test -tags chaos -count=1 -v -timeout 90m ./test/chaos  # the full suite
//
// Besides the figures, each scenario asserts its promise (0 lost, 0
// duplicated, ...) and fails the run when one does not hold.
package chaos
