#!/usr/bin/env bash
# build.sh [OUT]: builds bin/valruns (or OUT) and says what it is doing, since
# a first build downloads and compiles some 560 packages: minutes on two cores.
#
#   - modules missing from Go's module cache are downloaded first, said so;
#   - it counts the packages Go's build cache lacks (go list's Stale) and calls
#     the build a first build only when most of them are missing (a new
#     machine, a new Go version or a cleaned cache), otherwise says how many
#     packages changed;
#   - while compiling it shows how many of them are done: one line rewritten
#     in place on a terminal, a line every 10% otherwise (CI logs).
#
# `valruns version` shows the git revision: go build records it from a clone
# (-buildvcs=auto), and in a git worktree, where Go does not look (.git is a
# file there), this script passes it with -ldflags.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=${1:-bin/valruns}
pkg=github.com/valruns/valruns
flags=(-buildvcs=auto)
if [ -f .git ] && rev=$(git rev-parse HEAD 2>/dev/null); then
	modified=false
	[ -z "$(git status --porcelain 2>/dev/null)" ] || modified=true
	flags+=(-ldflags "-X $pkg/internal/cli.gitRevision=$rev -X $pkg/internal/cli.gitModified=$modified")
fi

if ! GOPROXY=off GOFLAGS=-mod=readonly "$GO" list -deps "$pkg" >/dev/null 2>&1; then
	echo "downloading the Go modules valruns needs (not yet in Go's module cache) ..."
	"$GO" mod download
fi

read -r stale all < <("$GO" list -deps "${flags[@]}" -f '{{.Stale}}' "$pkg" | awk '{n++} /true/ {s++} END {print s+0, n+0}')
if [ "$stale" -eq 0 ]; then
	"$GO" build "${flags[@]}" -o "$out" "$pkg"
	echo "$out is up to date"
	exit 0
fi
if [ $((stale * 2)) -gt "$all" ]; then
	echo "first build with this Go version and build cache: compiling $stale packages into $out," \
		"a few minutes on two cores (later builds take seconds) ..."
else
	echo "building $out: compiling $stale changed package(s) ..."
fi

# go build -v names each package as it compiles it, on stderr; anything else
# there (a compile error) is passed through.
tty=false
[ -t 1 ] && tty=true
began=$SECONDS
"$GO" build -v "${flags[@]}" -o "$out" "$pkg" 2>&1 | {
	done=0 step=$(((stale + 9) / 10)) next=$(((stale + 9) / 10))
	while IFS= read -r line; do
		if [[ $line =~ ^[A-Za-z0-9._/~-]+$ ]]; then
			done=$((done < stale ? done + 1 : stale))
			if $tty; then
				printf '\r  compiled %d/%d packages (%ds)\033[K' "$done" "$stale" $((SECONDS - began))
			elif [ "$done" -ge "$next" ]; then
				echo "  compiled $done/$stale packages ($((SECONDS - began))s)"
				next=$((next + step))
			fi
		else
			$tty && printf '\r\033[K'
			printf '%s\n' "$line"
		fi
	done
	$tty && printf '\n'
	true
}
echo "built $out in $((SECONDS - began))s"
