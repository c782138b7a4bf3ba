# Compensa. `make test` and `make demo` are the two commands a new user runs.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: test demo build vet postgres

build:
	$(GO) build -o bin/relay ./cmd/relay

postgres:
	@./scripts/ensure-postgres.sh

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

test: postgres vet
	$(GO) test -race -count=1 -timeout 20m ./...

demo: postgres build
	./bin/relay demo
