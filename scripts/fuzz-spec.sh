#!/usr/bin/env bash
# fuzz-spec.sh: an independent tool's fuzzing run of the server against its OpenAPI 3 document
# (make fuzz-spec; docs/design.md, "Fuzzing the spec with an independent tool").
#
# Portman (@apideck/portman, pinned in scripts/fuzz-spec/package-lock.json) reads
# docs/openapi.json and writes a Postman collection: one request per operation with contract
# tests (a 2xx, the documented Content-Type, a JSON body that fits the response schema, the
# documented required headers), and the variations of scripts/fuzz-spec/portman-config.json,
# each with the contract tests of the status it expects: Portman's fuzzing (required members
# removed, strings below minLength and above maxLength, numbers below minimum and above
# maximum, in bodies, headers and query parameters), and requests without a token, with a wrong
# token, with unknown members, values of the wrong type, ids that do not exist or are not
# UUIDs, a scope outside its enum, a key replayed and reused. newman runs the collection
# against a valruns started here, and the summary says how many requests were sent and how
# many disagreements (failed assertions) there were.
#
# The valruns is bin/valruns (make build) serving with its worker on its own address, on a
# fresh database created and migrated here and dropped afterwards, and on a private
# redis-server started here (the tests' and make run's Redis are never touched). The demo
# organisation, token and workflow come from `valruns demo`; one run is started with curl so
# that GET /api/runs/{id}/ and GET /api/idempotency-keys/... have something to find.
#
# Environment:
#   DATABASE_URL     a PostgreSQL URL whose server is used (default
#                    postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable); the run
#                    creates the database valruns_fuzz_<pid> beside it and drops it afterwards
#   FUZZ_ADDR        listen address of the valruns under test (default: a free port on 127.0.0.1)
#   FUZZ_REDIS_URL   a Redis to use instead of a private redis-server (it must be one nothing
#                    else uses: its queue is the valruns under test's)
#   FUZZ_REDIS_PORT  the private redis-server's port (default: a free one)
#   FUZZ_OUT         directory for the collection, newman's JSON report and the server's log
#                    (default: a temporary directory, kept when there are disagreements)
#   FUZZ_KEEP=1      keep the database, FUZZ_OUT and print where they are
#
# Exit status: 0 when the spec and the server agree on every request, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

say() { printf 'fuzz-spec: %s\n' "$*" >&2; }
die() { printf 'fuzz-spec: error: %s\n' "$*" >&2; exit 2; }

[ -x bin/valruns ] || die "bin/valruns is missing: run make build (make fuzz-spec does)"
scripts/install-bench-tools.sh fuzzspec || die "could not install Portman and newman (npm ci in scripts/fuzz-spec)"
TOOLS="$REPO/scripts/fuzz-spec"

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

OUT="${FUZZ_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/fuzz-spec.XXXXXX")}"
mkdir -p "$OUT"
ADDR="${FUZZ_ADDR:-127.0.0.1:$(free_port)}"
BASE="http://$ADDR"

# The database: DATABASE_URL's server, a database of our own.
ADMIN_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable}"
DB="valruns_fuzz_$$"
case "$ADMIN_URL" in *\?*) query="?${ADMIN_URL#*\?}" ;; *) query="" ;; esac
noquery="${ADMIN_URL%%\?*}"
FUZZ_DB_URL="${noquery%/*}/$DB$query"
ADMIN_URL="${noquery%/*}/postgres$query" # CREATE and DROP DATABASE from the maintenance database

server_pid="" redis_pid=""
cleanup() {
	local rc=$?
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
	[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
	if [ "${FUZZ_KEEP:-}" = 1 ]; then
		say "kept: database $DB, directory $OUT"
	else
		psql -X -q -w "$ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || say "could not drop database $DB"
		if [ -z "${FUZZ_OUT:-}" ] && [ "$rc" -eq 0 ]; then rm -rf "$OUT"; fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

psql -X -q -w -v ON_ERROR_STOP=1 "$ADMIN_URL" -c "CREATE DATABASE \"$DB\"" >/dev/null ||
	die "could not create database $DB with $ADMIN_URL (is PostgreSQL up? make services)"

if [ -n "${FUZZ_REDIS_URL:-}" ]; then
	REDIS="$FUZZ_REDIS_URL"
else
	command -v redis-server >/dev/null || die "redis-server is missing (apt-get install redis-server), or set FUZZ_REDIS_URL"
	rport="${FUZZ_REDIS_PORT:-$(free_port)}"
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
		--logfile "$OUT/redis.log" &
	redis_pid=$!
	REDIS="redis://127.0.0.1:$rport/0"
fi

export DATABASE_URL="$FUZZ_DB_URL" REDIS_URL="$REDIS" HTTP_ADDR="$ADDR"
# The fuzzer sends a few hundred starts in a burst: no start rate, so that a documented 429
# does not stand in for the answer a variation expects.
export ORG_START_RATE=0
bin/valruns migrate up >/dev/null
eval "$(bin/valruns demo --token-file "$OUT/demo-token")"

bin/valruns serve --worker >"$OUT/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
	curl -fsS -o /dev/null "$BASE/readyz" 2>/dev/null && break
	kill -0 "$server_pid" 2>/dev/null || die "valruns exited; its log: $OUT/server.log"
	sleep 0.1
done
curl -fsS -o /dev/null "$BASE/readyz" || die "valruns did not get ready at $BASE; its log: $OUT/server.log"

# One run under a known key, for the routes that read a run and a key.
IDEM_KEY="fuzz-known-$$"
RUN_ID=$(curl -fsS -X POST -H "Authorization: Bearer $DEMO_TOKEN" -H "Idempotency-Key: $IDEM_KEY" \
	-H 'Content-Type: application/json' -d '{"submission":{"customer":"ACME","total":42},"metadata":{"source":"fuzz"}}' \
	"$BASE/api/workflows/$DEMO_WORKFLOW/start/" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).id))')
[ -n "$RUN_ID" ] || die "could not start the known run"

# Two webhook endpoints: one the routes that read, list deliveries and rotate
# use, and one that the delete route deletes.
hook() {
	curl -fsS -X POST -H "Authorization: Bearer $DEMO_TOKEN" -H 'Content-Type: application/json' \
		-d "{\"url\":\"https://example.com/fuzz-$1\"}" "$BASE/api/webhook-endpoints/" |
		node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).id))'
}
HOOK_ID=$(hook read) && HOOK_DELETE_ID=$(hook delete)
[ -n "$HOOK_ID" ] && [ -n "$HOOK_DELETE_ID" ] || die "could not create the webhook endpoints"

say "valruns at $BASE (database $DB); generating the collection with Portman from docs/openapi.json"
node "$TOOLS/strip-schema-examples.js" docs/openapi.json "$OUT/openapi.json"
# (in $OUT: Portman writes a tmp/ of its own in its working directory)
(cd "$OUT" && "$TOOLS/node_modules/.bin/portman" --local "$OUT/openapi.json" --baseUrl "$BASE" \
	--portmanConfigFile "$TOOLS/portman-config.json" --output "$OUT/collection.json" \
	--includeTests) >"$OUT/portman.log" 2>&1 ||
	{ cat "$OUT/portman.log" >&2; die "Portman failed"; }

say "running the collection with newman"
set +e
"$TOOLS/node_modules/.bin/newman" run "$OUT/collection.json" \
	--env-var "baseUrl=$BASE" --env-var "apiKey=Bearer $DEMO_TOKEN" --env-var "token=$DEMO_TOKEN" --env-var "workflowId=$DEMO_WORKFLOW" \
	--env-var "runId=$RUN_ID" --env-var "idemKey=$IDEM_KEY" --env-var "hookId=$HOOK_ID" --env-var "hookDeleteId=$HOOK_DELETE_ID" \
	--env-var "runIdUpper=${RUN_ID^^}" --env-var "workflowIdUpper=${DEMO_WORKFLOW^^}" \
	--reporters cli,json --reporter-json-export "$OUT/newman.json" \
	--reporter-cli-no-summary --reporter-cli-no-success-assertions --reporter-cli-no-console \
	--color off --timeout-request 30000 >"$OUT/newman.log" 2>&1
newman_rc=$?
set -e
[ -s "$OUT/newman.json" ] || { cat "$OUT/newman.log" >&2; die "newman wrote no report"; }

rc=0
node "$TOOLS/summary.js" "$OUT/newman.json" || rc=$?
if [ "$newman_rc" -ne 0 ] || [ "$rc" -ne 0 ]; then
	say "disagreements: see above; the collection, newman's report and the server's log are in $OUT"
	exit 1
fi
