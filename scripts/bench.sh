#!/usr/bin/env bash
# Runs the benchmarks and prints, for BenchmarkStart, each situation's time
# per request beside its ratio to the no-key start: what idempotency costs.
set -euo pipefail
cd "$(dirname "$0")/.."
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
