#!/usr/bin/env bash
# test-under-load: run `make test` ROUNDS times in a row (default 5) while
# every core is kept busy by a shell busy loop, as on a loaded CI box; stop
# at the first failure. The tests assert their promise, not their timing,
# so they must pass like this.
#   scripts/test-under-load.sh            # make test x5 beside $(nproc) busy loops
#   ROUNDS=1 HOGS=4 scripts/test-under-load.sh
set -u
rounds=${ROUNDS:-5}
n=${HOGS:-$(nproc)}
hogs=()
for _ in $(seq "$n"); do ( while :; do :; done ) & hogs+=($!); done
stop() { kill "${hogs[@]}" 2>/dev/null; wait "${hogs[@]}" 2>/dev/null; }
trap stop EXIT INT TERM
for i in $(seq "$rounds"); do
	echo "test-under-load: round $i of $rounds, beside $n busy loops" >&2
	make test || { echo "test-under-load: round $i failed" >&2; exit 1; }
done
echo "test-under-load: $rounds rounds passed" >&2
