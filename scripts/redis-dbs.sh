#!/usr/bin/env bash
# redis-dbs.sh: keeps make run and make test apart in Redis, so that the tests
# never flush (or drain the queue of) a Redis database that make run uses.
#
#   make run   uses REDIS_URL's database (default redis://127.0.0.1:6379/0: database 0);
#   make test  uses TEST_REDIS_URL's database (default redis://127.0.0.1:16379/9, a private
#              Redis under .dev/: queues the tests share, never flushed) and databases
#              10 to 15 of the same server (each flushed by the test that takes it).
#
# It exits 1, saying why, when REDIS_URL names one of the tests' databases on the
# server of TEST_REDIS_URL; make run and make test run it first.
set -euo pipefail
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
TEST_REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:16379/9}"

# server_db URL -> "HOST:PORT DB" (localhost spelled 127.0.0.1, the port 6379 by default)
server_db() {
	local u="${1#*://}" hostport db=0
	u="${u%%\?*}"
	hostport="${u%%/*}"
	hostport="${hostport##*@}"
	if [[ $u == */* ]]; then db="${u#*/}"; fi
	db="${db:-0}"
	[[ $hostport == *:* ]] || hostport="$hostport:6379"
	[[ $hostport == localhost:* ]] && hostport="127.0.0.1:${hostport#*:}"
	echo "$hostport $db"
}

read -r run_server run_db < <(server_db "$REDIS_URL")
read -r test_server test_db < <(server_db "$TEST_REDIS_URL")
[[ $run_db =~ ^[0-9]+$ ]] || { echo "REDIS_URL=$REDIS_URL: the database must be a number" >&2; exit 1; }
if [ "$run_server" = "$test_server" ] && { [ "$run_db" = "$test_db" ] || { [ "$run_db" -ge 10 ] && [ "$run_db" -le 15 ]; }; }; then
	echo "REDIS_URL=$REDIS_URL is database $run_db of the Redis at $run_server, which make test uses" \
		"(TEST_REDIS_URL's database $test_db, and 10 to 15, which it flushes): make run would lose its" \
		"queue to the tests. Give make run another database (REDIS_URL=redis://$run_server/0)," \
		"or the tests another Redis (TEST_REDIS_URL)." >&2
	exit 1
fi
