#!/usr/bin/env bash
# bench.sh: the benchmark behind `make bench` (tools/bench/README.md). It
# measures valruns (the real binary, driven over HTTP) beside the peer a user
# would otherwise pick (tools/bench/peer) and beside the database's own limit
# (pgbench running hand-written scripts of a start's statements), and writes
# tools/bench/RESULTS.md with each part's targets.
#
#   scripts/bench.sh            full run: the start curve at 1 to 128 clients, end to end,
#                               the long poll, the profile, the noisy neighbour, the cleanup
#   QUICK=1 scripts/bench.sh    short runs at 1, 8 and 32 clients (checks the harness)
#   scripts/bench.sh e2e        end to end only (make bench-e2e); replaces its section
#   scripts/bench.sh noisy      the noisy neighbour only (make bench-noisy); replaces its section
#   scripts/bench.sh go         the Go micro-benchmarks of the handlers (make bench-go)
#   scripts/bench.sh -- ARGS    pass ARGS to the harness (e.g. -- -only wait -wait-duration 5s)
#
# It needs PostgreSQL at DATABASE_URL (make services starts one), pgbench,
# Node.js with npm, and redis-server: scripts/install-bench-tools.sh installs
# the missing packages with apt-get when running as root; otherwise it says
# what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'bench: %s\n' "$*"; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

micro() {
	# The Go micro-benchmarks of every package; for BenchmarkStart (through
	# the router, without HTTP), each start situation's time per request
	# beside its ratio to the no-key start.
	local out
	out=$(mktemp)
	trap 'rm -f "$out"' EXIT
	go test -run '^$' -bench . -benchmem -count=1 ./... | tee "$out"
	echo
	echo "BenchmarkStart: time per request, relative to a start without a key"
	awk '
	  /^BenchmarkStart\// {
	    name=$1; sub(/^BenchmarkStart\//, "", name); sub(/-[0-9]+$/, "", name)
	    for (i = 1; i <= NF; i++) if ($(i+1) == "ns/op") ns[name] = $i
	    order[++n] = name
	  }
	  END {
	    if (!("no_key" in ns)) { print "  (no BenchmarkStart/no_key result)"; exit }
	    for (i = 1; i <= n; i++) {
	      k = order[i]
	      printf "  %-16s %10.0f ns/op   %5.2fx\n", k, ns[k], ns[k] / ns["no_key"]
	    }
	  }' "$out"
}

parts=()
case "${1:-}" in
go | micro)
	micro
	exit 0
	;;
e2e)
	parts=(-only e2e)
	shift
	[ "${1:-}" != -- ] || shift
	;;
noisy)
	parts=(-only noisy)
	shift
	[ "${1:-}" != -- ] || shift
	;;
--) shift ;;
"") ;;
-h | --help | help)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
	;;
*) die "usage: $0 [go | e2e | noisy | -- HARNESS-ARGS]" ;;
esac

# pgbench, node and npm, redis-server and the peer's packages.
scripts/install-bench-tools.sh || die "the benchmark's tools are missing (see above)"

say "building bin/valruns and bin/valruns-bench ..."
go build -o bin/valruns .
# The harness is a module of its own (tools/bench/go.mod); it runs from here,
# the repository's root, where its paths (bin/, tools/bench/...) start.
go -C tools/bench build -o "$PWD/bin/valruns-bench" .

args=()
if [ -n "${QUICK:-}" ] && [ "${QUICK}" != 0 ]; then args+=(-quick); fi
exec bin/valruns-bench "${args[@]}" "${parts[@]}" "$@"
