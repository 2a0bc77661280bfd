#!/usr/bin/env bash
# install-promtool.sh: make sure promtool exists for the alert rules' tests (deploy/, make
# test) and print its path. Installs the Debian package "prometheus" (which ships
# /usr/bin/promtool) with apt-get when running as root. Idempotent: when promtool is already
# on PATH it only prints where it is.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
	command -v promtool
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "promtool missing: install it with sudo apt-get install prometheus" >&2
	exit 1
fi

echo "install-promtool: installing prometheus (for promtool) with apt-get ..." >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2

if ! command -v promtool >/dev/null 2>&1; then
	echo "install-promtool: promtool still not on PATH after apt-get install prometheus" >&2
	exit 1
fi
command -v promtool
