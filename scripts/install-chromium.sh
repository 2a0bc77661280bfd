#!/usr/bin/env bash
# install-chromium.sh: make sure a headless Chromium exists for the browser tests and print
# its path. Installs the Debian package "chromium" with apt-get when running as root.
# Idempotent: when a browser is already on PATH it only prints where it is.
set -euo pipefail

find_browser() {
	local b
	for b in chromium chromium-browser google-chrome google-chrome-stable; do
		if command -v "$b" >/dev/null 2>&1; then
			command -v "$b"
			return 0
		fi
	done
	return 1
}

if find_browser; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "chromium missing: install it with sudo apt-get install chromium" >&2
	exit 1
fi

echo "install-chromium: installing chromium with apt-get ..." >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2

if ! find_browser; then
	echo "install-chromium: chromium still not on PATH after apt-get install" >&2
	exit 1
fi
