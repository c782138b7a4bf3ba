# Compensa. `make test` and `make demo` are the two commands a new user runs.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: test demo build vet postgres chromium

build:
	$(GO) build -o bin/relay ./cmd/relay

postgres:
	@./scripts/ensure-postgres.sh

chromium:
	@./scripts/ensure-chromium.sh

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags failpoint ./cmd/relay

test: postgres chromium vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) --no-print-directory chaos QUICK=1

demo: postgres build
	./bin/relay demo

# `make bench` runs the full benchmark of BENCHMARKS.md (about 10 minutes);
# `make bench BENCH_FLAGS=--quick` is the smoke test CI runs.
.PHONY: bench
bench: postgres build
	./bin/relay bench $(BENCH_FLAGS)

# `make chaos` runs the fault suite of RELIABILITY.md (20 to 40 minutes) and
# prints each scenario's figures; `make chaos QUICK=1` is the short run for CI
# (about 3 minutes). CHAOS_FLAGS passes more, e.g. CHAOS_FLAGS='-chaos.only kill,pause'.
# `make bench-peers` runs the same workload (N processes of three trivial
# durable steps) on Compensa's runner, DBOS Transact Go and River, and pgbench's
# step shape, on one throwaway PostgreSQL, interleaved, and prints one table.
# bench/peers is a module of its own: the product never depends on the peers.
# PEERS_FLAGS passes more, e.g. PEERS_FLAGS='--n 1000 --repeats 1'.
.PHONY: bench-peers
bench-peers: postgres
	cd bench/peers && $(GO) build -o ../../bin/peers . && ../../bin/peers $(PEERS_FLAGS)

.PHONY: chaos
chaos: postgres
	$(GO) test -tags chaos -count=1 -v -timeout 90m -run '^TestChaos$$' ./test/chaos -args $(if $(QUICK),-chaos.quick) $(CHAOS_FLAGS)
