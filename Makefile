# riffle's two commands: `make demo` runs the main job, `make test` runs every test.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
PYTHON ?= /usr/bin/python3

.PHONY: all build demo test test-go test-python bench clean

all: build

build:
	$(GO) build -o bin/riffle ./cmd/riffle

demo:
	$(GO) run ./cmd/riffle demo

test: build
	./scripts/install-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	@if [ -d python/tests ]; then cd python && RIFFLE_BIN=$(CURDIR)/bin/riffle $(PYTHON) -m pytest -q tests; fi

bench: build
	./bench/run.sh

clean:
	rm -rf bin
