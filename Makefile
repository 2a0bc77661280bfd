# valruns: `make run` sets everything up and runs the service; `make test` runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go

export DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/valruns_test?sslmode=disable
export REDIS_URL ?= redis://127.0.0.1:6379/0
# Tests use their own Redis database numbers (TEST_REDIS_URL's and above) and flush them.
export TEST_REDIS_URL ?= redis://127.0.0.1:6379/9
export HTTP_ADDR ?= 127.0.0.1:8080

.PHONY: run test build services docs bench fmt vet

build:
	$(GO) build -o bin/valruns .

services:
	@scripts/dev-services.sh

run: services build
	@MIGRATE_ON_START=true bin/valruns migrate up >/dev/null
	@eval "$$(bin/valruns demo --token-file .dev/demo-token)"; \
	base="http://$(HTTP_ADDR)"; \
	echo; \
	echo "valruns is starting at $$base (API + worker in one process; Ctrl-C stops it)"; \
	echo "  Swagger UI: $$base/swagger/index.html   (Authorize with: Bearer $$DEMO_TOKEN)"; \
	echo "  Metrics:    $$base/metrics"; \
	echo "  Try it:"; \
	echo "    curl -s -H 'Authorization: Bearer $$DEMO_TOKEN' $$base/api/workflows/"; \
	echo "    curl -s -X POST -H 'Authorization: Bearer $$DEMO_TOKEN' -H 'Idempotency-Key: demo-1' \\"; \
	echo "         -d '{\"submission\":{\"customer\":\"ACME\",\"total\":42}}' $$base/api/workflows/$$DEMO_WORKFLOW/start/"; \
	echo; \
	MIGRATE_ON_START=true exec bin/valruns serve --worker

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '^docs/')

vet:
	$(GO) vet ./...

test: services
	$(GO) vet ./...
	@bad=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' | grep -v '^docs/')); \
	if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; echo "run: make fmt"; exit 1; fi
	$(GO) test -race -count=1 ./...

bench: services
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...
