# riffle's two commands: `make demo` runs the main job, `make test` runs every test.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
# The tests run on Debian's python3 with its PyTorch, in the virtualenv
# scripts/install-deps.sh makes on top of it (pyarrow, datasets, webdataset).
PYTHON ?= $(CURDIR)/.venv/bin/python
# Decode images with libjpeg-turbo where its headers are installed
# (scripts/install-deps.sh installs them); pure Go otherwise.
TAGS ?= $(shell ./scripts/go-tags)

.PHONY: all build demo test test-go test-python docs bench bench-peers clean

all: build

# scripts/build-daemon says first how many packages it compiles and how
# long a first build takes (minutes), then counts them. bin/riffle keeps
# its symbols and DWARF for debuggers; the wheel's (python/setup.py) is
# stripped.
build:
	GO="$(GO)" RIFFLE_TAGS="$(TAGS)" ./scripts/build-daemon bin/riffle

demo: build
	bin/riffle demo

test: build
	./scripts/install-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	@if [ -n "$(TAGS)" ]; then $(GO) test -count=1 -tags "$(TAGS)" ./transform; fi
	GO=$(GO) ./scripts/fuzz-briefly
	@if [ -d python/tests ]; then cd python && RIFFLE_BIN=$(CURDIR)/bin/riffle $(PYTHON) -m pytest -q tests; fi
	$(PYTHON) -m pytest -q -p no:cacheprovider bench/peers/test_harness.py
	./scripts/test-installed.sh
	$(MAKE) docs

# The documentation site (mkdocs.yml) into site/: --strict fails on a broken
# link or anchor, a page missing from the nav or a nav entry with no page.
# Every code block of the pages runs in python/tests/test_docs.py. Not
# --quiet: it hides the warnings --strict counts, and the build passes.
docs:
	$(PYTHON) -m mkdocs build --strict

bench: build
	./bench/run.sh

# riffle against the loaders users would pick instead (BENCHMARKS.md's
# first table); root, for dropping the page cache.
bench-peers: build
	./bench/peers/setup.sh
	$(PYTHON) bench/peers/harness.py

clean:
	rm -rf bin
