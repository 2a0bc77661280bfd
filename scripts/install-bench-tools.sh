#!/usr/bin/env bash
# install-bench-tools.sh: make sure what the benchmark (make bench) and its tests need exists:
# pgbench, Node.js with npm, redis-server, and the peer's Node packages (npm ci in tools/bench/peer);
# also the typed-client test's Node packages (npm ci in internal/tsclient: openapi-typescript, tsc)
# and the spec lint test's (npm ci in internal/apispec/lint: Redocly CLI).
# Installs the missing Debian packages (postgresql-client, nodejs, npm, redis-server) with
# apt-get when running as root; otherwise it says what to install and exits 1.
# Idempotent and quick when everything is there.
#
#   scripts/install-bench-tools.sh           everything
#   scripts/install-bench-tools.sh pgbench   only pgbench (and so on: node, redis-server, peer, tsclient, speclint)
#   scripts/install-bench-tools.sh fuzzspec  Portman and newman for make fuzz-spec (not in "everything")
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'install-bench-tools: %s\n' "$*" >&2; }
die() { printf 'install-bench-tools: error: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }

apt_updated=
# need COMMAND PACKAGE...: install the Debian packages that provide COMMAND when it is missing.
need() {
	local cmd="$1"
	shift
	have "$cmd" && return 0
	if is_root && have apt-get; then
		if [ -z "$apt_updated" ]; then
			say "installing $* with apt-get ..."
			apt-get update -qq >&2 || die "apt-get update failed"
			apt_updated=1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 || die "apt-get install $* failed"
		have "$cmd" || die "$cmd still missing after apt-get install $*"
	else
		die "$cmd is missing; install it with: sudo apt-get install $*"
	fi
}

# npm_ci DIR WHAT: install DIR's pinned Node packages (npm ci), again only
# when its package-lock.json changed since the last install.
npm_ci() {
	local dir="$1" what="$2"
	need node nodejs npm
	need npm npm
	local stamp="$dir/node_modules/.package-lock.json"
	if [ -f "$stamp" ] && [ ! "$dir/package-lock.json" -nt "$stamp" ]; then
		return 0
	fi
	say "installing $what (npm ci in $dir) ..."
	# npm 11 may judge a lock written on another machine out of sync when it
	# lacks optional packages for other platforms (BullMQ's msgpackr-extract):
	# then npm install, which installs the locked versions all the same (npm ci is
	# silenced: the npm install after it says what fails, if anything).
	(cd "$dir" && { npm ci --no-audit --no-fund --loglevel=silent >&2 ||
		npm install --no-audit --no-fund --no-save --loglevel=error >&2; }) || die "npm ci / npm install failed in $dir"
}

peer() { npm_ci tools/bench/peer "the peer's Node packages"; }

# tsclient: openapi-typescript and tsc for the typed-client test (internal/tsclient).
tsclient() { npm_ci internal/tsclient "openapi-typescript and TypeScript"; }

# speclint: Redocly CLI for the spec lint test (internal/apispec/lint).
speclint() { npm_ci internal/apispec/lint "Redocly CLI"; }

# fuzzspec: Portman and newman for make fuzz-spec (scripts/fuzz-spec.sh); not part of the
# default list, since make test does not run the fuzzer.
fuzzspec() { npm_ci scripts/fuzz-spec "Portman and newman"; }

what=("$@")
[ ${#what[@]} -gt 0 ] || what=(pgbench node redis-server peer tsclient speclint)
for w in "${what[@]}"; do
	case "$w" in
	pgbench) need pgbench postgresql-client ;;
	node) need node nodejs npm ;;
	redis-server) need redis-server redis-server ;;
	peer) peer ;;
	tsclient) tsclient ;;
	speclint) speclint ;;
	fuzzspec) fuzzspec ;;
	*) die "unknown tool '$w' (want pgbench, node, redis-server, peer, tsclient, speclint or fuzzspec)" ;;
	esac
done
