#!/usr/bin/env bash
# bench.sh: the benchmark behind `make bench`. It measures valruns (the real
# binary, driven over HTTP) beside the peer a user would otherwise pick
# (tools/bench/peer: Express + express-idempotency + Redis + pg) and beside the
# database's own limit (pgbench replaying the SQL a start sends, captured at
# run time), and writes tools/bench/RESULTS.md with the ratios and their targets.
#
#   scripts/bench.sh            full run: the curve at 1, 4, 8, 16, 32, 64 and 128 clients, the
#                               experiment log and the noisy neighbour (about 40 minutes on 2 cores;
#                               it prints its estimate first)
#   QUICK=1 scripts/bench.sh    short runs at 1, 8 and 32 clients (about 10 minutes)
#   scripts/bench.sh e2e        the experiment log only (make bench-e2e): PostgreSQL work
#                               per run, end to end (the end-to-end curve), backlog drain, beside
#                               the baseline (BENCH_BASELINE, default 0b107b5); replaces those
#                               sections of tools/bench/RESULTS.md (QUICK=1: short, about 4 minutes)
#   scripts/bench.sh noisy      the noisy neighbour only (make bench-noisy): B's starts and runs
#                               alone, while A floods and behind A's slow runs, and A's own
#                               throughput, per set of settings (-noisy-env); replaces that
#                               section of tools/bench/RESULTS.md (about 15 minutes; QUICK=1: about 3)
#   scripts/bench.sh go         the Go micro-benchmarks of the handlers (make bench-go)
#   scripts/bench.sh -- ARGS    pass ARGS to the harness (e.g. -- -only valruns,peer -clients 8,32)
#
# It needs PostgreSQL at DATABASE_URL (make services starts one), pgbench,
# Node.js with npm, and redis-server (or BENCH_REDIS_URL, a Redis database
# the benchmark may flush). scripts/install-bench-tools.sh installs the missing
# packages with apt-get when running as root; otherwise it says what to install.
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

# pgbench, node and npm, redis-server (unless BENCH_REDIS_URL) and the peer's packages.
scripts/install-bench-tools.sh || die "the benchmark's tools are missing (see above)"

say "building bin/valruns and bin/valruns-bench ..."
go build -o bin/valruns .
# The harness is a module of its own (tools/bench/go.mod); it runs from here,
# the repository's root, where its paths (bin/, tools/bench/...) start.
go -C tools/bench build -o "$PWD/bin/valruns-bench" .

args=()
if [ -n "${QUICK:-}" ] && [ "${QUICK}" != 0 ]; then args+=(-quick); fi
exec bin/valruns-bench "${args[@]}" "${parts[@]}" "$@"
