#!/usr/bin/env bash
# dev-services.sh: make sure PostgreSQL and Redis answer at the addresses the service uses
# (DATABASE_URL, TEST_DATABASE_URL, REDIS_URL) and that the databases exist.
#
#   scripts/dev-services.sh          ensure everything is up (default; idempotent, quick)
#   scripts/dev-services.sh stop     stop the private services this script started under .dev/
#
# A server already answering is used as is. A local one (127.0.0.1, localhost, ::1) that does
# not answer is started: the Debian cluster for that port when one exists (pg_ctlcluster),
# otherwise a private cluster in <repo>/.dev/pg<PORT>; Redis as a private daemon with its
# files in <repo>/.dev. Missing packages are installed with apt-get when running as root
# (a cluster created by that installation gets trust auth on 127.0.0.1/::1, like the private
# one). Existing system services are never stopped or reconfigured. Missing databases are
# created, and the URL's role too (as superuser) when the server lets us in as postgres.
#
# Environment:
#   DATABASE_URL          default postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable
#   TEST_DATABASE_URL     default DATABASE_URL with the database name valruns_test
#   REDIS_URL             default redis://127.0.0.1:6379/0
#   TEST_REDIS_URL        optional; checked/started too when it names another server
#   DEV_SERVICES_TIMEOUT  seconds to wait for a server to answer (default 30)
set -euo pipefail

PROG=dev-services
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
DEV_DIR="$REPO_DIR/.dev"
TIMEOUT="${DEV_SERVICES_TIMEOUT:-30}"

DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }
is_local_host() { case "$1" in 127.0.0.1 | localhost | ::1) return 0 ;; *) return 1 ;; esac; }
# Host as it appears in a URL / in "host:port" messages.
hostport() { case "$1" in *:*) printf '[%s]:%s' "$1" "$2" ;; *) printf '%s:%s' "$1" "$2" ;; esac; }
# Path relative to the repo for messages.
rel() { case "$1" in "$REPO_DIR"/*) printf '%s' "${1#"$REPO_DIR"/}" ;; *) printf '%s' "$1" ;; esac; }

url_decode() {
	local s="${1//+/%2B}"
	printf '%b' "${s//%/\\x}"
}

# sql_lit/sql_ident: quote a value as an SQL string literal / identifier.
sql_lit() { printf "'%s'" "${1//\'/\'\'}"; }
sql_ident() { printf '"%s"' "${1//\"/\"\"}"; }

# parse_url URL DEFAULT_PORT -> sets U_SCHEME U_USER U_PASS U_HOST U_PORT U_PATH U_QUERY
parse_url() {
	local url="$1" rest auth hp
	case "$url" in
	*://*) ;;
	*) die "cannot parse URL '$url' (expected scheme://[user[:password]@]host[:port]/path)" ;;
	esac
	U_SCHEME="${url%%://*}"
	rest="${url#*://}"
	U_QUERY=""
	case "$rest" in *\?*) U_QUERY="${rest#*\?}" rest="${rest%%\?*}" ;; esac
	rest="${rest%%#*}"
	U_PATH=""
	case "$rest" in */*) U_PATH="${rest#*/}" rest="${rest%%/*}" ;; esac
	U_USER="" U_PASS=""
	case "$rest" in
	*@*)
		auth="${rest%@*}"
		hp="${rest##*@}"
		case "$auth" in
		*:*) U_USER=$(url_decode "${auth%%:*}") U_PASS=$(url_decode "${auth#*:}") ;;
		*) U_USER=$(url_decode "$auth") ;;
		esac
		;;
	*) hp="$rest" ;;
	esac
	U_PORT="$2"
	case "$hp" in
	\[*\]:*) U_HOST="${hp%%]*}" U_HOST="${U_HOST#[}" U_PORT="${hp##*]:}" ;;
	\[*\]) U_HOST="${hp#[}" U_HOST="${U_HOST%]}" ;;
	*:*) U_HOST="${hp%%:*}" U_PORT="${hp##*:}" ;;
	*) U_HOST="$hp" ;;
	esac
	[ -n "$U_HOST" ] || U_HOST=127.0.0.1
	[ -n "$U_PORT" ] || U_PORT="$2"
	case "$U_PORT" in '' | *[!0-9]*) die "bad port '$U_PORT' in URL '$url'" ;; esac
}

# query_param QUERY NAME -> value or empty
query_param() {
	local kv IFS='&'
	for kv in $1; do
		[ "${kv%%=*}" = "$2" ] && { url_decode "${kv#*=}"; return 0; }
	done
	return 0
}

# A free-standing TCP connect probe, for when the client tools are missing.
# shellcheck disable=SC2016 # expanded by the inner bash
tcp_probe() { timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }

apt_install() {
	is_root || return 1
	say "installing $* with apt-get ..."
	apt-get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 9>&- || die "apt-get install $* failed"
}

# -------------------------------------------------------------------------------------------
# PostgreSQL
# -------------------------------------------------------------------------------------------

PG_BIN=""
find_pg_bin() {
	local d best=""
	for d in /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] || continue
		if [ -z "$best" ] || [ "$(basename "$(dirname "$d")")" -gt "$(basename "$(dirname "$best")")" ] 2>/dev/null; then
			best="$d"
		fi
	done
	if [ -z "$best" ] && have initdb && have pg_ctl; then best=$(dirname "$(command -v initdb)"); fi
	PG_BIN="$best"
	[ -n "$PG_BIN" ]
}

# pg_state HOST PORT -> 0 accepting, 1 rejecting (starting/stopping), 2 no answer
pg_state() {
	local rc=0
	if have pg_isready; then
		pg_isready -q -h "$1" -p "$2" -t 2 >/dev/null 2>&1 || rc=$?
		case "$rc" in 0 | 1) return "$rc" ;; *) return 2 ;; esac
	fi
	tcp_probe "$1" "$2" && return 0
	return 2
}

# give_up SERVICE ADDR [LOG]: the service did not answer in time; show the
# end of its log, if any, and stop.
give_up() {
	printf '%s: error: %s at %s did not answer within %ss\n' "$PROG" "$1" "$2" "$TIMEOUT" >&2
	if [ -n "${3:-}" ] && [ -r "$3" ]; then
		printf '%s: last lines of %s:\n' "$PROG" "$3" >&2
		tail -n 20 "$3" >&2
	fi
	exit 1
}

# wait_pg HOST PORT [LOGFILE]
wait_pg() {
	local deadline=$((SECONDS + TIMEOUT)) rc
	while :; do
		rc=0
		pg_state "$1" "$2" || rc=$?
		[ "$rc" -eq 0 ] && return 0
		[ "$SECONDS" -ge "$deadline" ] && give_up PostgreSQL "$(hostport "$1" "$2")" "${3:-}"
		sleep 0.3
	done
}

# Where private clusters live. Normally <repo>/.dev; when running as root and the postgres OS
# user cannot reach the repo (e.g. it is under /root), a fixed per-repo directory in /var/tmp.
pg_base_dirs() {
	printf '%s\n' "$DEV_DIR" "/var/tmp/valruns-dev-$(printf '%s' "$REPO_DIR" | cksum | cut -d' ' -f1)"
}

# run_pg CMD...: run a PostgreSQL server command as the cluster owner (postgres when root).
run_pg() {
	if is_root; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

start_private_pg() {
	local host="$1" port="$2" base data log sockdir listen
	if is_root; then
		id postgres >/dev/null 2>&1 || die "the 'postgres' OS user does not exist (is the postgresql package installed correctly?)"
	fi
	mkdir -p "$DEV_DIR"
	base="$DEV_DIR"
	if is_root && ! runuser -u postgres -- test -x "$DEV_DIR" 2>/dev/null; then
		base=$(pg_base_dirs | tail -n 1)
		mkdir -p "$base"
		chmod 755 "$base"
	fi
	data="$base/pg$port"
	log="$base/pg$port.log"
	sockdir="$base/sock"
	# Unix socket paths are limited to ~107 bytes.
	if [ "${#sockdir}" -gt 90 ]; then sockdir="/tmp/valruns-dev-$(id -u)"; fi
	mkdir -p "$data" "$sockdir"
	touch "$log"
	if is_root; then chown postgres: "$data" "$sockdir" "$log"; fi
	chmod 700 "$data"

	if [ ! -f "$data/PG_VERSION" ]; then
		say "initialising private PostgreSQL cluster in $(rel "$data") ..."
		run_pg "$PG_BIN/initdb" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 -D "$data" >>"$log" 2>&1 ||
			run_pg "$PG_BIN/initdb" -U postgres --auth=trust -E UTF8 --locale=C -D "$data" >>"$log" 2>&1 ||
			{ tail -n 20 "$log" >&2; die "initdb failed (log: $log)"; }
		case "$host" in ::1) listen="::1" ;; localhost) listen="127.0.0.1,::1" ;; *) listen="127.0.0.1" ;; esac
		# Settings of a throw-away development cluster: durability traded for speed.
		run_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# --- added by scripts/dev-services.sh (private development cluster) ---
listen_addresses = '$listen'
port = $port
unix_socket_directories = '$sockdir'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
	fi
	say "starting private PostgreSQL in $(rel "$data") on $(hostport "$host" "$port") ..."
	if ! run_pg "$PG_BIN/pg_ctl" -D "$data" -l "$log" -w -t "$TIMEOUT" start >/dev/null 2>&1 9>&-; then
		printf '%s: error: could not start PostgreSQL in %s; last lines of %s:\n' "$PROG" "$data" "$log" >&2
		tail -n 20 "$log" >&2
		exit 1
	fi
	wait_pg "$host" "$port" "$log"
}

# The clusters the postgresql package just created (this run installed it, so nobody else uses
# them yet) get trust authentication on the loopback addresses, like the private cluster, so
# that the password-less default URLs work. Existing clusters are never reconfigured.
trust_new_clusters() {
	local before=" ${1//$'\n'/ } " ver name _port status hba
	have pg_lsclusters || return 0
	while read -r ver name _port status _; do
		[[ "$before" == *" $ver/$name "* ]] && continue
		hba="/etc/postgresql/$ver/$name/pg_hba.conf"
		[ -f "$hba" ] || continue
		grep -q 'added by valruns scripts/dev-services.sh' "$hba" && continue
		say "new cluster $ver/$name: allowing trust authentication from 127.0.0.1 and ::1 (development setup) ..."
		{
			printf '# added by valruns scripts/dev-services.sh (development machine)\n'
			printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n\n'
			cat "$hba"
		} >"$hba.new"
		chown --reference="$hba" "$hba.new"
		chmod --reference="$hba" "$hba.new"
		mv "$hba.new" "$hba"
		case "$status" in online*) pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload 9>&- || true ;; esac
	done < <(pg_lsclusters -h 2>/dev/null || true)
}

# ensure_postgres HOST PORT
ensure_postgres() {
	local host="$1" port="$2" rc=0 ver name cport status owner logf
	pg_state "$host" "$port" || rc=$?
	[ "$rc" -eq 0 ] && return 0
	if [ "$rc" -eq 1 ]; then
		wait_pg "$host" "$port"
		return 0
	fi
	if ! is_local_host "$host"; then
		say "PostgreSQL at $(hostport "$host" "$port") is not local (this script cannot start it); waiting ${TIMEOUT}s for it ..."
		wait_pg "$host" "$port"
		return 0
	fi

	if ! find_pg_bin; then
		if is_root; then
			local before=""
			if have pg_lsclusters; then before=$(pg_lsclusters -h 2>/dev/null | awk '{print $1 "/" $2}'); fi
			apt_install postgresql postgresql-client
			find_pg_bin || die "PostgreSQL server binaries still missing after apt-get install"
			trust_new_clusters "$before"
			# The package may have created (and started) a cluster on this very port.
			rc=0
			pg_state "$host" "$port" || rc=$?
			[ "$rc" -eq 0 ] && return 0
		else
			die "PostgreSQL is not running at $(hostport "$host" "$port") and is not installed; install it with: sudo apt-get install postgresql redis-server"
		fi
	fi

	# A Debian cluster configured for this port?
	if have pg_lsclusters; then
		while read -r ver name cport status owner _ logf; do
			[ "$cport" = "$port" ] || continue
			if [ "$status" = online ] || [[ "$status" == online,* ]]; then
				die "PostgreSQL cluster $ver/$name is running but does not answer on $(hostport "$host" "$port"); check listen_addresses in /etc/postgresql/$ver/$name/postgresql.conf"
			fi
			if is_root || [ "$(id -un)" = "$owner" ]; then
				say "starting PostgreSQL cluster $ver/$name (port $port) ..."
				pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start 9>&- ||
					{ tail -n 20 "$logf" >&2 2>/dev/null || true; die "pg_ctlcluster $ver $name start failed (log: $logf)"; }
			elif have sudo && sudo -n true 2>/dev/null; then
				say "starting PostgreSQL cluster $ver/$name (port $port) with sudo ..."
				sudo -n pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start 9>&- ||
					die "sudo pg_ctlcluster $ver $name start failed (log: $logf)"
			else
				say "cluster $ver/$name (port $port) is down and only root can start it; using a private cluster instead"
				break
			fi
			wait_pg "$host" "$port" "$logf"
			return 0
		done < <(pg_lsclusters -h 2>/dev/null || true)
	fi

	start_private_pg "$host" "$port"
}

# Runs psql as superuser 'postgres' against a local server, trying TCP (trust auth), then the
# Unix sockets (peer auth as the postgres OS user, for the Debian clusters).
admin_psql() {
	local host="$1" port="$2" sock
	shift 2
	if PGPASSWORD="" psql -X -q -v ON_ERROR_STOP=1 -w -h "$host" -p "$port" -U postgres -d postgres "$@" 2>/dev/null; then
		return 0
	fi
	is_local_host "$host" || return 1
	for sock in /var/run/postgresql "$DEV_DIR/sock" "$(pg_base_dirs | tail -n 1)/sock" "/tmp/valruns-dev-$(id -u)" /tmp; do
		[ -S "$sock/.s.PGSQL.$port" ] || continue
		if is_root; then
			(cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -w -h "$sock" -p "$port" -d postgres "$@") 2>/dev/null && return 0
		else
			psql -X -q -v ON_ERROR_STOP=1 -w -h "$sock" -p "$port" -U postgres -d postgres "$@" 2>/dev/null && return 0
		fi
	done
	return 1
}

# ensure_databases HOST PORT USER PASSWORD SSLMODE DB...
ensure_databases() {
	local host="$1" port="$2" user="$3" pass="$4" sslmode="$5" out err db list="" attempt
	shift 5
	export PGCONNECT_TIMEOUT=5
	[ -n "$sslmode" ] && export PGSSLMODE="$sslmode"
	user_psql() { PGPASSWORD="$pass" psql -X -q -v ON_ERROR_STOP=1 -w -h "$host" -p "$port" -U "$user" -d postgres "$@"; }

	for db in "$@"; do list+="${list:+,}$(sql_lit "$db")"; done
	local q="SELECT datname FROM pg_database WHERE datname IN ($list)"

	if ! out=$(user_psql -tAc "$q" 2>&1); then
		err="$out"
		case "$err" in
		*"role \"$user\" does not exist"* | *"no password supplied"* | *"authentication failed"*)
			# With password authentication the server hides whether the role exists: ask as superuser.
			local exists=""
			exists=$(admin_psql "$host" "$port" -tAc "SELECT 1 FROM pg_roles WHERE rolname=$(sql_lit "$user")") || exists="?"
			if [ -z "$exists" ]; then
				say "creating PostgreSQL role $user (superuser) on $(hostport "$host" "$port") ..."
				local create
				create="CREATE ROLE $(sql_ident "$user") LOGIN SUPERUSER"
				[ -n "$pass" ] && create+=" PASSWORD $(sql_lit "$pass")"
				admin_psql "$host" "$port" -c "$create" >/dev/null || die "could not create role $user on $(hostport "$host" "$port")"
				out=$(user_psql -tAc "$q" 2>&1) && err="" || err="$out"
			elif [ "$exists" = "?" ] && [[ "$err" == *"does not exist"* ]]; then
				die "role '$user' does not exist on $(hostport "$host" "$port") and this script has no superuser access to create it; create it with: sudo -u postgres createuser -s $user"
			fi
			;;
		esac
		if [ -n "$err" ]; then
			case "$err" in
			*"no password supplied"* | *"authentication failed"*)
				die "PostgreSQL at $(hostport "$host" "$port") refused user $user: $err
  Either put the right password in the URL (postgres://$user:PASSWORD@$(hostport "$host" "$port")/...),
  or allow trust authentication for 127.0.0.1 in that cluster's pg_hba.conf (development machines only)." ;;
			*) die "cannot connect to PostgreSQL at $(hostport "$host" "$port") as $user: $err" ;;
			esac
		fi
	fi

	for db in "$@"; do
		grep -qxF -- "$db" <<<"$out" && continue
		say "creating database $db on $(hostport "$host" "$port") ..."
		for attempt in 1 2 3 4 5; do
			# Another run may create it concurrently, or template1 may be briefly busy.
			if user_psql -c "CREATE DATABASE $(sql_ident "$db")" 2>/dev/null ||
				admin_psql "$host" "$port" -c "CREATE DATABASE $(sql_ident "$db") OWNER $(sql_ident "$user")" 2>/dev/null; then
				break
			fi
			if [ -n "$(user_psql -tAc "SELECT 1 FROM pg_database WHERE datname=$(sql_lit "$db")" 2>/dev/null)" ]; then
				break
			fi
			[ "$attempt" -eq 5 ] && die "could not create database $db on $(hostport "$host" "$port"): $(user_psql -c "CREATE DATABASE $(sql_ident "$db")" 2>&1 || true)"
			sleep 1
		done
	done
}

# -------------------------------------------------------------------------------------------
# Redis
# -------------------------------------------------------------------------------------------

# resp_ping HOST PORT USER PASS: PING over a raw TCP connection, prints the answer.
resp_ping() {
	local line
	exec 3<>"/dev/tcp/$1/$2" || return 0
	if [ -n "$4" ]; then
		if [ -n "$3" ]; then printf 'AUTH %s %s\r\n' "$3" "$4" >&3; else printf 'AUTH %s\r\n' "$4" >&3; fi
		IFS= read -r -t 2 line <&3 || return 0
		case "$line" in -*) printf '%s\n' "${line#-}"; return 0 ;; esac
	fi
	printf 'PING\r\n' >&3
	IFS= read -r -t 2 line <&3 || return 0
	line=${line%$'\r'}
	printf '%s\n' "${line#[+-]}"
}

# redis_ping HOST PORT USER PASS -> prints the server's answer to PING (empty when no answer)
redis_ping() {
	local host="$1" port="$2" user="$3" pass="$4"
	if have redis-cli; then
		local args=(-h "$host" -p "$port")
		[ -n "$user" ] && args+=(--user "$user")
		[ -n "$pass" ] && args+=(--pass "$pass" --no-auth-warning)
		timeout 3 redis-cli "${args[@]}" ping 2>/dev/null | head -n 1 || true
		return 0
	fi
	# No redis-cli: speak RESP over bash's /dev/tcp (in a child bash, under a timeout).
	timeout 3 bash -c "$(declare -f resp_ping); resp_ping \"\$@\"" _ "$host" "$port" "$user" "$pass" 2>/dev/null || true
}

# wait_redis HOST PORT USER PASS [LOGFILE]
wait_redis() {
	local deadline=$((SECONDS + TIMEOUT)) reply
	while :; do
		reply=$(redis_ping "$1" "$2" "$3" "$4")
		case "$reply" in
		PONG) return 0 ;;
		"" | LOADING* | *"-LOADING"*) ;;
		*) die "Redis at $(hostport "$1" "$2") answered '$reply' to PING (check REDIS_URL credentials)" ;;
		esac
		[ "$SECONDS" -ge "$deadline" ] && give_up Redis "$(hostport "$1" "$2")" "${5:-}"
		sleep 0.2
	done
}

ensure_redis() {
	local host="$1" port="$2" user="$3" pass="$4" reply log pidf
	reply=$(redis_ping "$host" "$port" "$user" "$pass")
	[ "$reply" = PONG ] && return 0
	if [ -n "$reply" ] || ! is_local_host "$host"; then
		# Something answers (loading, auth error...) or it is not ours to start: wait / report.
		is_local_host "$host" || say "Redis at $(hostport "$host" "$port") is not local (this script cannot start it); waiting ${TIMEOUT}s for it ..."
		wait_redis "$host" "$port" "$user" "$pass"
		return 0
	fi
	if ! have redis-server; then
		if is_root; then
			apt_install redis-server
			have redis-server || die "redis-server still missing after apt-get install"
			reply=$(redis_ping "$host" "$port" "$user" "$pass")
			[ "$reply" = PONG ] && return 0
		else
			die "Redis is not running at $(hostport "$host" "$port") and is not installed; install it with: sudo apt-get install postgresql redis-server"
		fi
	fi
	mkdir -p "$DEV_DIR"
	log="$DEV_DIR/redis$port.log"
	pidf="$DEV_DIR/redis$port.pid"
	local -a bind
	case "$host" in ::1) bind=(::1) ;; localhost) bind=(127.0.0.1 -::1) ;; *) bind=(127.0.0.1) ;; esac
	say "starting private Redis on $(hostport "$host" "$port") (files in $(rel "$DEV_DIR")) ..."
	local args=(--daemonize yes --bind "${bind[@]}" --port "$port" --save '' --appendonly no
		--dir "$DEV_DIR" --logfile "$log" --pidfile "$pidf")
	if [ -n "$pass" ] && { [ -z "$user" ] || [ "$user" = default ]; }; then args+=(--requirepass "$pass"); fi
	redis-server "${args[@]}" >/dev/null 9>&- || { tail -n 20 "$log" >&2 2>/dev/null || true; die "redis-server failed to start (log: $log)"; }
	wait_redis "$host" "$port" "$user" "$pass" "$log"
}

# -------------------------------------------------------------------------------------------
# stop: private services only
# -------------------------------------------------------------------------------------------

stop_private() {
	local base data pidf pid port stopped=0
	while read -r base; do
		[ -d "$base" ] || continue
		for data in "$base"/pg*/; do
			data="${data%/}"
			[ -f "$data/PG_VERSION" ] || continue
			[ -f "$data/postmaster.pid" ] || continue
			find_pg_bin || die "pg_ctl not found"
			if run_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
				say "stopping private PostgreSQL in $(rel "$data") ..."
				run_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null
				stopped=$((stopped + 1))
			fi
		done
	done < <(pg_base_dirs)
	# Redis: the pid in .dev/redis<PORT>.pid when it is a redis-server; otherwise a server on
	# that port whose pidfile is ours (asked with CONFIG GET) is shut down over the protocol.
	local f ports=" "
	for f in "$DEV_DIR"/redis*.pid "$DEV_DIR"/redis*.log; do
		[ -e "$f" ] || continue
		port="${f##*/redis}"
		port="${port%.*}"
		[[ "$port" =~ ^[0-9]+$ ]] && [[ "$ports" != *" $port "* ]] && ports+="$port "
	done
	for port in $ports; do
		pidf="$DEV_DIR/redis$port.pid"
		pid=$(cat "$pidf" 2>/dev/null || true)
		if [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ] &&
			tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "redis-server"; then
			say "stopping private Redis on port $port (pid $pid) ..."
			kill -TERM "$pid"
			local n=0
			while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 100 ]; do
				sleep 0.1
				n=$((n + 1))
			done
			kill -0 "$pid" 2>/dev/null && die "Redis pid $pid did not stop"
			stopped=$((stopped + 1))
		elif have redis-cli &&
			[ "$(timeout 3 redis-cli -h 127.0.0.1 -p "$port" config get pidfile 2>/dev/null | sed -n 2p)" = "$pidf" ]; then
			say "stopping private Redis on port $port ..."
			timeout 5 redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
			stopped=$((stopped + 1))
		fi
		rm -f "$pidf"
	done
	if [ "$stopped" -eq 0 ]; then say "no private services running"; fi
}

# -------------------------------------------------------------------------------------------

main_start() {
	local -a pg_servers=() dbs=()
	local url key host port user pass sslmode db seen=" "

	if [ -z "${TEST_DATABASE_URL:-}" ]; then
		local base="${DATABASE_URL%%\?*}" q=""
		[[ "$DATABASE_URL" == *\?* ]] && q="?${DATABASE_URL#*\?}"
		local scheme="${base%%://*}://" rest="${base#*://}"
		TEST_DATABASE_URL="${scheme}${rest%%/*}/valruns_test${q}"
	fi

	# Group the databases by server (user@host:port).
	local -A server_dbs=() server_pass=() server_ssl=()
	for url in "$DATABASE_URL" "$TEST_DATABASE_URL"; do
		parse_url "$url" 5432
		case "$U_SCHEME" in postgres | postgresql) ;; *) die "unsupported database URL scheme '$U_SCHEME' (want postgres://)" ;; esac
		user="${U_USER:-${PGUSER:-$(id -un)}}"
		db=$(url_decode "${U_PATH%%/*}")
		[ -n "$db" ] || db="$user"
		sslmode=$(query_param "$U_QUERY" sslmode)
		key="$U_HOST|$U_PORT|$user"
		if [ -z "${server_dbs[$key]+x}" ]; then
			pg_servers+=("$key")
			server_pass[$key]="$U_PASS"
			server_ssl[$key]="$sslmode"
		fi
		[[ " ${server_dbs[$key]:-} " == *" $db "* ]] || server_dbs[$key]="${server_dbs[$key]:-}${server_dbs[$key]:+ }$db"
	done

	local pg_desc="" db_desc=""
	for key in "${pg_servers[@]}"; do
		IFS='|' read -r host port user <<<"$key"
		if [[ "$seen" != *" $host:$port "* ]]; then
			ensure_postgres "$host" "$port"
			seen+="$host:$port "
			pg_desc+="${pg_desc:+, }$(hostport "$host" "$port")"
		fi
		if ! have psql; then
			if is_root; then apt_install postgresql-client; else die "psql missing; install it with: sudo apt-get install postgresql-client"; fi
		fi
		read -r -a dbs <<<"${server_dbs[$key]}"
		ensure_databases "$host" "$port" "$user" "${server_pass[$key]}" "${server_ssl[$key]}" "${dbs[@]}"
		for db in "${dbs[@]}"; do db_desc+="${db_desc:+, }$db"; done
	done

	# REDIS_URL, and TEST_REDIS_URL (set by the Makefile) when it names another server.
	local redis_desc="" rseen=" "
	for url in "$REDIS_URL" "${TEST_REDIS_URL:-}"; do
		[ -n "$url" ] || continue
		parse_url "$url" 6379
		case "$U_SCHEME" in
		redis) ;;
		rediss) die "rediss:// (TLS) is not supported by this script" ;;
		*) die "unsupported Redis URL scheme '$U_SCHEME' in '$url' (want redis://)" ;;
		esac
		[[ "$rseen" == *" $U_HOST:$U_PORT "* ]] && continue
		rseen+="$U_HOST:$U_PORT "
		ensure_redis "$U_HOST" "$U_PORT" "$U_USER" "$U_PASS"
		redis_desc+="${redis_desc:+, }$(hostport "$U_HOST" "$U_PORT")"
	done

	say "postgres $pg_desc ok, redis $redis_desc ok, databases $db_desc ok"
}

# Serialise concurrent runs (parallel `make test`s) so only one of them starts a server.
# Daemons started while it is held get "9>&-" so that they do not inherit the lock.
lock() {
	# The braces keep 2>/dev/null for the exec alone: on exec itself it would
	# silence every later error message of the script.
	if have flock && mkdir -p "$DEV_DIR" 2>/dev/null && { exec 9>>"$DEV_DIR/.lock"; } 2>/dev/null; then
		flock -w 120 9 || die "another dev-services.sh run holds $DEV_DIR/.lock"
	fi
}

case "${1:-start}" in
start | up) lock && main_start ;;
stop | down) lock && stop_private ;;
-h | --help | help)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
	;;
*) die "usage: $0 [start|stop]" ;;
esac
