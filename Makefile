# The only way things are run: the README, .ci/run and developers use these.
GO      ?= go
BIN     := bin
# cgo on for macOS builds: the Metal backend (darwinkit and its device
# helper) is Objective-C. Everywhere else the binaries are pure Go.
ifeq ($(shell $(GO) env GOOS),darwin)
export CGO_ENABLED ?= 1
else
export CGO_ENABLED ?= 0
endif

.PHONY: all build test demo bench vet fmt clean darwin-check cgo

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

## darwin-check: type-check the darwin-only Metal code, and the worker and bench that link it, on any OS
darwin-check:
	$(GO) run ./internal/darwincheck ./metal/... ./cmd/worker ./cmd/bench

# cgo: print the CGO_ENABLED the builds use (tests check it per GOOS)
cgo:
	@echo $(CGO_ENABLED)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) report
