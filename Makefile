# The only way things are run: the README, .ci/run and developers use these.
GO      ?= go
BIN     := bin
export CGO_ENABLED ?= 0

.PHONY: all build test demo bench vet fmt clean darwin-check

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: everything CI runs (installs redis-server, versitygw, numpy when missing)
test:
	scripts/test.sh

## demo: zero-setup demo: a dev worker and a few hundred synthetic jobs
demo: build
	scripts/demo.sh

## bench: the benchmark harness against the machine's ceilings
bench: build
	scripts/bench.sh

vet:
	$(GO) vet ./...

## darwin-check: type-check the darwin-only Metal code (and its tests) on any OS
darwin-check:
	$(GO) run ./internal/darwincheck ./metal/...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) report
