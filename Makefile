# snapcoord: build, test and verification entry points.
#
# Every tool is pinned by a tool module under tools/ (tools/dev holds the
# project's own development programs, built by `make build`) and run with
# `go tool -modfile=tools/X/go.mod NAME`; the first use downloads and builds it
# from the Go module proxy (buf takes a few minutes cold), later uses are fast.
# Run every target from the repository root. `make help` lists the targets.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build
MAKEFLAGS += --no-builtin-rules --no-print-directory

GO ?= go

# The toolchain is pinned like every other tool: go1.27.3 carries the standard
# library security fixes that the machines' go1.26.8 lacks (make vuln finds
# fourteen there). The go command fetches it once from the Go module proxy
# (about 76 MB, a few seconds) and caches it; go.mod still says 1.26, so a
# plain `go build` with the machine's Go works too.
GO_TOOLCHAIN := go1.27.3
export GOTOOLCHAIN := $(GO_TOOLCHAIN)
# GOFLAGS from the environment is respected (e.g. -buildvcs=false), except
# -modfile and -mod=vendor: they would apply to the tool modules too and break
# them. The root module needs no vendor directory; go.mod stays read-only.
override GOFLAGS := $(strip $(filter-out -modfile=% -mod=%,$(GOFLAGS)) -mod=readonly)
export GOFLAGS

BUF         := $(GO) tool -modfile=tools/buf/go.mod buf
STATICCHECK := $(GO) tool -modfile=tools/lint/go.mod staticcheck

# The Python client runs on Debian's packages for Debian's Python (see
# scripts/deps-python.sh); a pyenv or venv python3 on PATH lacks them.
PYTHON ?= /usr/bin/python3
# Generated Python code: everything protoc writes under client/python
# (*_pb2*.py and their *_pb2.pyi stubs in snapcoord/v1 and, vendored inside
# the package, snapcoord/_vendor/buf/validate); the __init__.py files next to
# it are written by hand.
PY_GEN_DIRS := snapcoord/v1 snapcoord/_vendor/buf/validate

# The vulnerability database is the Go module golang.org/x/vulndb at a pinned
# version (its data/osv/ holds the OSV entries); govulncheck's online database
# is not reachable here. Update the version deliberately, like any dependency.
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
VULNDB_DIR     := .cache/vulndb/$(VULNDB_VERSION)

# Where buf breaking compares from. See verify-breaking.
BREAKING_BRANCH ?= main

.PHONY: help build run test test-python generate verify verify-generated verify-buf-lint \
	verify-breaking verify-fmt verify-vet verify-tidy lint vuln e2e tools clean demo ui-check deploy-check slurm-e2e

help: ## List the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | \
		sed -E 's/^([a-z0-9-]+):.*## (.*)/  \1\t\2/' | expand -t 20

# The version and commit that --version prints when the go command recorded
# no VCS information in the build (-buildvcs=false, which this machine's go env
# sets, or a source tree without .git); see cmd/internal/version. Recursive
# (=), so that only targets that build run git.
VERSION_PKG := github.com/snapcoord/snapcoord/cmd/internal/version
BUILD_VERSION = $(shell git describe --always --dirty 2>/dev/null || echo unknown)
BUILD_COMMIT = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_LDFLAGS = -X $(VERSION_PKG).stampedVersion=$(BUILD_VERSION) -X $(VERSION_PKG).stampedCommit=$(BUILD_COMMIT)

build: ## Build the binaries (snapcoord, snapctl and the tools/dev programs) into bin/ (stamped with git describe and the commit).
	$(GO) build -ldflags '$(BUILD_LDFLAGS)' -o bin/ ./cmd/... ./tools/dev/...

# Where `make run`'s coordinator listens and keeps its data, e.g. a second
# one beside the first: make run LISTEN=127.0.0.1:7080
# METRICS_LISTEN=127.0.0.1:7081 DATA_DIR=./data-2. Unset, serve's defaults
# apply (or its SNAPCOORD_LISTEN, SNAPCOORD_METRICS_LISTEN and
# SNAPCOORD_DATA_DIR variables).
LISTEN ?=
METRICS_LISTEN ?=
DATA_DIR ?=

run: build ## Run the coordinator with its defaults (127.0.0.1:7070, metrics 127.0.0.1:7071, data in ./data); LISTEN=, METRICS_LISTEN=, DATA_DIR= move them.
	./bin/snapcoord serve$(if $(LISTEN), --listen '$(LISTEN)')$(if $(METRICS_LISTEN), --metrics-listen '$(METRICS_LISTEN)')$(if $(DATA_DIR), --data-dir '$(DATA_DIR)')

# The Debian packages are checked first, so that a machine without them (and
# no root to install them) stops at once, before any build.
test: ## Run all tests: Go with the race detector (the etcd store's on a real etcd cluster), then the Python client's against bin/snapcoord.
	scripts/deps-python.sh
	scripts/deps-etcd.sh
	$(MAKE) build
	$(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) test-python

# The Python client's tests run against the package as a user installs it:
# pip installs client/python (no index: the in-tree build backend needs only
# the standard library) into a virtual environment under .cache/ that sees
# Debian's grpcio, protobuf and pytest, and pytest runs with that
# environment's python, -P keeping the current directory off sys.path:
# nothing imports the source tree (tests/test_imports.py checks). The
# environment is made once and the package installed afresh each time.
# PYTEST_ARGS picks the tests, e.g. make test-python
# PYTEST_ARGS='client/python/tests/test_workers.py -k superseded'. A suite
# that hangs (a thread that never ends keeps the interpreter up) is stopped
# with SIGABRT after 10 minutes, which makes faulthandler print every
# thread's stack. PYTEST_WORKERS processes run the tests (pytest-xdist,
# from Debian): most of a test's time is waiting on a coordinator's timers,
# so two halve the suite's 3.7 minutes on 2 cores; 0 runs them in this one.
PY_VENV := .cache/python-venv
PYTEST_ARGS ?= client/python/tests
PYTEST_WORKERS ?= 2

test-python: ## Run the Python client's tests (PYTEST_ARGS=, default all) against it installed into .cache/python-venv, and bin/snapcoord (make build first).
	scripts/deps-python.sh
	[ -x $(PY_VENV)/bin/python ] || $(PYTHON) -m venv --system-site-packages $(PY_VENV)
	PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
		$(PY_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation --force-reinstall ./client/python
	SNAPCOORD_BIN='$(CURDIR)/bin/snapcoord' SNAPCOORD_TEST_INSTALLED=1 PYTHONDONTWRITEBYTECODE=1 \
		timeout -s ABRT 10m $(PY_VENV)/bin/python -P -X faulthandler -m pytest -p no:cacheprovider -q -o faulthandler_timeout=120 -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

generate: ## Regenerate api/ and the Python client's code from proto/ (removes the old generated files first).
	if [ -d api ]; then find api -name '*.pb.go' -delete; find api -mindepth 1 -type d -empty -delete; fi
	$(BUF) generate
	scripts/deps-python.sh
	for d in $(PY_GEN_DIRS); do if [ -d "client/python/$$d" ]; then find "client/python/$$d" \( -name '*_pb2*.py' -o -name '*_pb2*.pyi' \) -delete; fi; done
	scripts/gen-python.sh client/python

# verify runs every check (-k) and fails if any of them failed.
verify: ## Check generated code, protos, formatting, vet and go.mod tidiness.
	@$(MAKE) -k verify-generated verify-buf-lint verify-breaking verify-fmt verify-vet verify-tidy
	@echo "verify: all checks passed"

verify-generated: ## api/ and client/python's generated code match a fresh generate (in a temporary directory).
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp"; \
	if ! diff -ru api "$$tmp/api"; then \
		echo "verify-generated: api/ is out of date with proto/: run 'make generate' and commit the result" >&2; \
		exit 1; \
	fi; \
	echo "verify-generated: api/ is up to date"; \
	scripts/deps-python.sh; \
	scripts/gen-python.sh "$$tmp/py"; \
	stale=0; for d in $(PY_GEN_DIRS); do \
		diff -ru --exclude=__init__.py --exclude=__pycache__ "client/python/$$d" "$$tmp/py/$$d" || stale=1; \
	done; \
	if [ "$$stale" -ne 0 ]; then \
		echo "verify-generated: client/python's generated code is out of date with proto/: run 'make generate' and commit the result" >&2; \
		exit 1; \
	fi; \
	echo "verify-generated: client/python is up to date"

verify-buf-lint: ## buf lint and buf format.
	$(BUF) lint
	$(BUF) format --diff --exit-code

# On a clone whose current commit is main this compares main with itself, so it
# only catches uncommitted changes; on a feature branch it checks the branch
# against main. Where no local branch main exists (detached or single-branch
# checkouts) the check is skipped, loudly.
verify-breaking: ## buf breaking against the local branch main.
	@if [ ! -d .git ] || ! git rev-parse --verify --quiet 'refs/heads/$(BREAKING_BRANCH)' >/dev/null; then \
		echo "verify-breaking: SKIPPED: no local branch '$(BREAKING_BRANCH)' to compare with (detached or non-git checkout)"; \
		exit 0; \
	fi; \
	if [ "$$(git rev-parse HEAD)" = "$$(git rev-parse 'refs/heads/$(BREAKING_BRANCH)')" ]; then \
		echo "verify-breaking: HEAD is the same commit as $(BREAKING_BRANCH): only uncommitted proto changes can show up"; \
	fi; \
	$(BUF) breaking --against '.git#branch=$(BREAKING_BRANCH)'; \
	echo "verify-breaking: no breaking change against $(BREAKING_BRANCH)"

verify-fmt: ## gofmt -l lists nothing (tracked and new files, .gitignore respected).
	@files=$$(git ls-files -co --exclude-standard -- '*.go' | while read -r f; do if [ -f "$$f" ]; then echo "$$f"; fi; done); \
	bad=$$(if [ -n "$$files" ]; then gofmt -l $$files; fi); \
	if [ -n "$$bad" ]; then echo "verify-fmt: not gofmt'ed (run gofmt -w):" >&2; echo "$$bad" >&2; exit 1; fi; \
	echo "verify-fmt: ok"

verify-vet: ## go vet ./...
	$(GO) vet ./...

verify-tidy: ## go mod tidy would change nothing in the root module.
	$(GO) mod tidy -diff

lint: ## go vet and staticcheck; mypy and pyflakes on the Python client (its generated code is not linted).
	$(GO) vet ./...
	$(STATICCHECK) ./...
	scripts/deps-python.sh
	cd client/python && $(PYTHON) -m mypy
	find client/python -name '*.py' ! -name '*_pb2*.py' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 $(PYTHON) -m pyflakes

# The local database is built once per VULNDB_VERSION under .cache/ (git-ignored),
# into a temporary directory first so an interrupted build leaves nothing behind.
$(VULNDB_DIR)/index/db.json:
	@echo "vuln: building the local vulnerability database from golang.org/x/vulndb@$(VULNDB_VERSION)"
	@src=$$(cd / && $(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	if [ ! -d "$$src/data/osv" ]; then echo "vuln: golang.org/x/vulndb@$(VULNDB_VERSION) has no data/osv" >&2; exit 1; fi; \
	rm -rf '$(VULNDB_DIR).tmp'; mkdir -p '$(VULNDB_DIR).tmp'; \
	$(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns "$$src/data/osv" -out '$(VULNDB_DIR).tmp'; \
	rm -rf '$(VULNDB_DIR)'; mv '$(VULNDB_DIR).tmp' '$(VULNDB_DIR)'

# scripts/govulncheck.sh runs govulncheck and fails on any called vulnerability
# not listed, with a reason, in scripts/govulncheck-allow.txt.
vuln: $(VULNDB_DIR)/index/db.json ## govulncheck against the pinned local vulnerability database.
	scripts/govulncheck.sh 'file://$(CURDIR)/$(VULNDB_DIR)' ./...

e2e: build ## Start bin/snapcoord; run docs/grpcurl.md and the README quick start against it.
	SNAPCOORD_BIN=bin/snapcoord SNAPCTL_BIN=bin/snapctl scripts/e2e-grpcurl.sh

# Root only: it installs Slurm, munge and python3-torch (and the Python
# client's Debian packages) with apt-get if they are missing, starts a
# four-node cluster on this machine (scripts/slurm-setup.sh) and, pass or
# fail, tears it down (scripts/slurm-teardown.sh).
slurm-e2e: build ## Four-node Slurm on this machine (network namespaces), the recipe of docs/slurm.md across nodes: requeues, a node killed, extension, backstop, no coordinator; then torn down (6.5-8 min).
	scripts/deps-python.sh
	rc=0; { scripts/slurm-setup.sh && scripts/slurm-e2e.sh; } || rc=$$?; scripts/slurm-teardown.sh || rc=1; exit $$rc

# ui-check: the status page in a real browser (Debian's chromium, installed
# when missing). Screenshots and DOM dumps go to .cache/ui-check/.
ui-check: build ## Load the status page in headless Chromium (a run through its deadline, one with a lagging rank, a silent worker and a failed snapshot, one past B); check the lanes and flags; save screenshots (about 30 s).
	scripts/ensure-debs.sh chromium
	./bin/snapuicheck --snapcoord bin/snapcoord --out .cache/ui-check

deploy-check: build ## Check deploy/: promtool on the alert rules, the dashboard JSON, systemd-analyze on the unit, metric names in a real scrape.
	scripts/deploy-check.sh

demo: build ## Live demo (~40 s): 2 trainer ranks, 3 sidecars; fails unless the deadline save beats B.
	./bin/snapdemo --snapcoord bin/snapcoord --snapctl bin/snapctl

tools: ## Download and build every pinned tool (buf takes minutes the first time).
	$(GO) tool -modfile=tools/protoc/go.mod -n protoc-gen-go >/dev/null
	$(GO) tool -modfile=tools/protoc/go.mod -n protoc-gen-go-grpc >/dev/null
	$(GO) tool -modfile=tools/lint/go.mod -n staticcheck >/dev/null
	$(GO) tool -modfile=tools/lint/go.mod -n govulncheck >/dev/null
	$(GO) tool -modfile=tools/lint/go.mod -n grpcurl >/dev/null
	$(GO) tool -modfile=tools/buf/go.mod -n buf >/dev/null

clean: ## Remove bin/. Leaves data/ (coordinator state) and .cache/ alone.
	rm -rf bin/

# Measurement: figures with their floors, the kill -9 crash loop, fuzzing
# (docs/performance.md). BENCH_FLAGS scales the benchmark, e.g.
# BENCH_FLAGS='--fanout-workers 10000 --json-file bench.json'.
.PHONY: bench bench-storm bench-smoke crashtest crashtest-ha fuzz
# make bench's deadline storm is smaller than make bench-storm's 200 runs,
# to keep make bench within a few minutes.
BENCH_STORM_RUNS ?= 50
CRASH_CYCLES ?= 20
HA_CYCLES ?= 10
FUZZTIME ?= 30s
# Every fuzz target, as package:Name; make fuzz runs each for FUZZTIME.
FUZZ_TARGETS := ./server/deadline:FuzzParseBudget ./server/grpcserver:FuzzCreateRun \
	./server/grpcserver:FuzzWorkerService ./server/grpcserver:FuzzRunService \
	./cmd/internal/durations:FuzzParse

# The deadline policies' simulation (docs/simulation.md): seeded, so a rerun
# prints the same tables. SIM_FLAGS e.g. '--runs 300 --workloads AC'.
SIM_FLAGS ?=
.PHONY: sim sim-frontier
sim: ## Simulate workloads A-H under each deadline policy and write the tables into docs/simulation.md.
	$(GO) run ./tools/dev/snapsim --doc docs/simulation.md $(SIM_FLAGS)

sim-frontier: ## Compare ExpectedLoss settings over workloads A-H (a few minutes) and write the frontier into docs/simulation.md.
	$(GO) run ./tools/dev/snapsim --frontier --runs 1000 --doc docs/simulation.md $(SIM_FLAGS)

bench: build ## Load benchmark: each figure with its floor and ratio, on bbolt and on etcd, the deadline storm at BENCH_STORM_RUNS runs (about 5 min on 2 cores).
	scripts/deps-etcd.sh
	./bin/snapbench --snapcoord bin/snapcoord --storm-runs $(BENCH_STORM_RUNS) $(BENCH_FLAGS)

bench-storm: build ## The deadline storm alone at issue #26's size: 200 runs × 8 ranks × 50 workers with the same B, on bbolt and etcd, each against the no-op floor (about 2 min).
	scripts/deps-etcd.sh
	./bin/snapbench --snapcoord bin/snapcoord --storm $(BENCH_FLAGS)

bench-smoke: ## Run every go test benchmark once (-benchtime=1x), so none rots.
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./...

crashtest: build ## kill -9 crash loop, CRASH_CYCLES times; fails if an acknowledged write is lost.
	./bin/snapcrash --snapcoord bin/snapcoord --cycles $(CRASH_CYCLES)

crashtest-ha: build ## Leader kill/pause loop on 3 etcd members and 3 coordinators, HA_CYCLES times (docs/ha.md); fails on a lost write, a changed decision or a write a deposed leader kept.
	scripts/deps-etcd.sh
	./bin/snapcrash --snapcoord bin/snapcoord --ha --cycles $(HA_CYCLES) --step-every 100ms

fuzz: ## Run every fuzz target for FUZZTIME (e.g. FUZZTIME=10s).
	for t in $(FUZZ_TARGETS); do \
		$(GO) test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZTIME) "$${t%%:*}"; \
	done
