# valruns: `make run` sets everything up and runs the service; `make test` runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go

export DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/valruns_test?sslmode=disable
# make run uses REDIS_URL's database (0). The tests use a private Redis that
# scripts/dev-services.sh starts under .dev/ (port 16379): TEST_REDIS_URL's
# database (9, never flushed) and 10 to 15, which they flush; they stop,
# deleting nothing, when one of those holds keys they did not write
# (internal/testredis). Neither starts when REDIS_URL names one of the
# tests' databases (scripts/redis-dbs.sh).
export REDIS_URL ?= redis://127.0.0.1:6379/0
export TEST_REDIS_URL ?= redis://127.0.0.1:16379/9
# Another port: make run HTTP_ADDR=127.0.0.1:8090 (it prints B for the Quickstart).
export HTTP_ADDR ?= 127.0.0.1:8080

.PHONY: run test fuzz-spec redis-dbs test-under-load test-tools reliability build services docs docs-check swag bench bench-e2e bench-noisy bench-go fmt vet

# The first build on a machine downloads and compiles some 560 packages, for
# minutes: scripts/build.sh says when a build is a first one and shows its
# progress, and records the git revision for `valruns version`.
build:
	@GO=$(GO) scripts/build.sh bin/valruns

services:
	@scripts/dev-services.sh

redis-dbs:
	@scripts/redis-dbs.sh

run: redis-dbs services build
	@MIGRATE_ON_START=true bin/valruns migrate up >/dev/null
	@eval "$$(bin/valruns demo --token-file .dev/demo-token)"; \
	base="http://$(HTTP_ADDR)"; \
	echo; \
	echo "valruns is starting at $$base (API + worker in one process; Ctrl-C stops it)"; \
	echo "  Swagger UI: $$base/swagger/index.html   (Authorize with: Bearer $$DEMO_TOKEN)"; \
	echo "  Metrics:    $$base/metrics"; \
	echo "  In another shell (the README's Quickstart goes on from here):"; \
	echo "    export B=$$base TOKEN=$$DEMO_TOKEN DEMO_WORKFLOW=$$DEMO_WORKFLOW"; \
	echo "    curl -s -H \"Authorization: Bearer \$$TOKEN\" \$$B/api/workflows/"; \
	echo "    curl -s -X POST -H \"Authorization: Bearer \$$TOKEN\" -H 'Idempotency-Key: curl-1' \\"; \
	echo "         -d '{\"submission\":{\"customer\":\"ACME\",\"total\":42}}' \$$B/api/workflows/\$$DEMO_WORKFLOW/start/"; \
	echo; \
	MIGRATE_ON_START=true exec bin/valruns serve --worker

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '^docs/')

# The Go client is a module of its own (client/go.mod: go 1.25, the standard
# library only), used by the service through go.mod's replace directive; the
# benchmark harness is one too (tools/bench/go.mod), which uses the service's
# packages through its own replace directive. ./... descends into neither, so
# vet and test name them (go -C client, go -C tools/bench) as well.
vet:
	$(GO) vet ./...
	$(GO) -C client vet ./...
	$(GO) -C tools/bench vet ./...

test: redis-dbs services docs-check test-tools
	$(GO) vet ./...
	$(GO) -C client vet ./...
	$(GO) -C tools/bench vet ./...
	@bad=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' | grep -v '^docs/')); \
	if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; echo "run: make fmt"; exit 1; fi
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) -C client test -race -count=1 ./...
	$(GO) -C tools/bench test -race -count=1 -timeout 20m ./...

# test-under-load: make test five times in a row beside a busy loop per
# core (ROUNDS, HOGS); the tests must not depend on the machine's speed.
test-under-load:
	@scripts/test-under-load.sh

# test-tools: what some tests need besides Go and the services, installed when
# missing (apt-get as root; npm ci for the Node packages): Chromium for the
# browser test; pgbench, Node.js with the peer's packages and redis-server for
# the bench package's tests; Node.js with openapi-typescript and Redocly CLI
# for the typed-client and spec lint tests; promtool (Debian's prometheus package) for the
# alert rules' unit tests in deploy/. A test whose tool cannot be had skips itself, and
# since go test shows nothing of a package that passes, this says so here.
SKIP_BANNER = printf '\n%s\n%s\n%s\n\n' "$$(printf '!%.0s' $$(seq 72))" "$(1)" "$$(printf '!%.0s' $$(seq 72))"
test-tools:
	@scripts/install-bench-tools.sh || $(call SKIP_BANNER,the tests that need pgbench / Node.js / redis-server (bench, typed client, spec lint) will be SKIPPED: see above)
	@scripts/install-chromium.sh >/dev/null || $(call SKIP_BANNER,the Swagger UI browser test will be SKIPPED: no Chromium (see above))
	@scripts/install-promtool.sh >/dev/null || $(call SKIP_BANNER,the alert rules' promtool tests (deploy/) will be SKIPPED: no promtool (see above))

# fuzz-spec: an independent fuzzer (Portman + newman, npm) runs against a valruns of
# its own (bin/valruns, a fresh database, a private redis-server) and checks every answer
# against docs/openapi.json; prints the requests sent and the disagreements, exit 1 on any
# (about a minute; not part of make test: it needs the npm registry once). docs/design.md: "Fuzzing
# the spec with an independent tool".
fuzz-spec: services build
	@scripts/fuzz-spec.sh

# The process-level fault suite alone, verbosely (reliability/, reliability/README.md):
# real binaries, replicas and workers killed, its own PostgreSQL and Redis
# restarted. It needs no running services; `make test` runs it too.
# RELIABILITY_OUT=file also writes its report table there in Markdown.
reliability:
	$(GO) test -race -count=1 -v -timeout 20m -run TestReliability ./reliability/

# bench: the benchmark (tools/bench/README.md): the start curve at 1 to 128
# clients beside the Node peer and the database's limit (pgbench of the
# hand-written scripts in tools/bench/sql), end to end, the long poll,
# the profile, the noisy neighbour and the cleanup; writes
# tools/bench/RESULTS.md (about 40 min). QUICK=1: clients 1, 8 and 32, short
# runs (checks the harness).
QUICK ?=
bench: services
	@QUICK=$(QUICK) scripts/bench.sh

# bench-e2e, bench-noisy: end to end alone, the noisy neighbour alone; each
# replaces its section of tools/bench/RESULTS.md. BENCH_ARGS passes harness
# flags, e.g. BENCH_ARGS='-e2e-clients 1,8' or
# BENCH_ARGS='-noisy-env "ORG_START_RATE=0" -noisy-env "ORG_START_RATE= ORG_RUN_SHARE=40"'.
BENCH_ARGS ?=
bench-e2e: services
	@QUICK=$(QUICK) scripts/bench.sh e2e -- $(BENCH_ARGS)

bench-noisy: services
	@QUICK=$(QUICK) scripts/bench.sh noisy -- $(BENCH_ARGS)

# bench-go: the Go micro-benchmarks (handlers through the router, no HTTP).
bench-go: services
	@scripts/bench.sh go

# The swag CLI, pinned. It must equal the swag library version in go.mod
# (docs/docs.go is generated for that library); `swag --version` cannot tell
# (v1.16.6 still prints v1.16.4), so the module version is read from the binary.
SWAG_VERSION := v1.16.6
SWAG := bin/swag
# One definition of how docs/ is generated, used by docs and docs-check.
SWAG_INIT = $(SWAG) init --quiet -g apidoc.go -d ./ --parseInternal --markdownFiles internal/apispec/tags --outputTypes go,json,yaml

swag:
	@have=$$($(GO) version -m $(SWAG) 2>/dev/null | awk '$$1 == "mod" && $$2 == "github.com/swaggo/swag" {print $$3}' || true); \
	if [ "$$have" != "$(SWAG_VERSION)" ]; then \
		echo "installing swag $(SWAG_VERSION) into bin/"; \
		GOBIN=$(CURDIR)/bin $(GO) install github.com/swaggo/swag/cmd/swag@$(SWAG_VERSION); \
	fi; \
	lib=$$($(GO) list -m -f '{{.Version}}' github.com/swaggo/swag); \
	if [ "$$lib" != "$(SWAG_VERSION)" ]; then \
		echo "go.mod requires github.com/swaggo/swag $$lib but the Makefile pins SWAG_VERSION $(SWAG_VERSION): make them equal"; exit 1; \
	fi

# docs/ is the OpenAPI (Swagger 2.0) spec generated from the swag annotations
# of apidoc.go and handlers/, served at /swagger/; commit it. Its examples are
# answers of the API, not text: TestAPIExamples sends every documented
# situation to the real router on a test database (so the services must run)
# and records the answers in internal/apispec/examples.json, which
# internal/apispec/apply then merges into swag's output (swag cannot write
# response examples). make test fails when an answer has changed since.
# apply also writes out the common responses an annotation names
# ("common:unauthorized": apispec.Common, written once) and every answer's
# X-Request-Id, and the rules swag cannot (apispec.Tighten: patterns,
# additionalProperties, security: []; .swaggo maps json.RawMessage to any
# JSON; --markdownFiles holds the long tag descriptions) and converts the
# result to OpenAPI 3 (docs/openapi.json, docs/openapi.yaml) with
# kin-openapi; docs-check covers all of it.
APPLY_EXAMPLES = $(GO) run ./internal/apispec/apply
# The table of errors of docs/api.md, from the problem codes' pages (package
# problem), which the service also serves at /problems/<code>.
PROBLEM_TABLE = $(GO) run ./internal/apispec/problems

docs: services swag
	$(GO) test -count=1 -run '^TestAPIExamples$$' ./handlers/ -args -update-examples
	$(SWAG_INIT) -o docs
	$(APPLY_EXAMPLES) docs
	$(PROBLEM_TABLE) docs/api.md

# docs-check fails when docs/ differs from what the annotations and the
# recorded examples generate (docs/*.md are written by hand, but for the
# table of errors of docs/api.md, which it checks too).
docs-check: swag
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(SWAG_INIT) -o "$$tmp/docs"; \
	$(APPLY_EXAMPLES) "$$tmp/docs"; \
	if ! diff -r -x '*.md' docs "$$tmp/docs"; then echo "docs/ is stale: run make docs"; exit 1; fi; \
	$(PROBLEM_TABLE) -check docs/api.md
