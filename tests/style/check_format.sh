#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Check C sources and headers against the tree's .clang-format with clang-format 14: list every
# file clang-format would change, with how many of its lines, and fail if there is one.
#
# Usage: tests/style/check_format.sh [PATH...]
#   PATH   files or directories to check (directories: their tracked *.c and *.h); by default
#          every tracked *.c and *.h of lib/ preload/ kmod/ tools/ include/
# Environment:
#   CLANG_FORMAT   the clang-format to run (default clang-format-14, else a clang-format that is
#                  version 14: other versions format differently)
# Exit status: 0 every file is formatted, 1 some are not, 2 usage, 77 no clang-format 14 (skipped).
# The formatting is clang-format's, then tests/style/align_comments.py's (the further lines of a
# trailing comment under its text: clang-format leaves them where they were).
# What would change in FILE: tests/style/format.sh --diff FILE; formatting in place:
# tests/style/format.sh FILE... (no FILE: every checked file).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
DEFAULT_DIRS=(lib preload kmod tools include)

case ${1:-} in
-h | --help) sed -n '3,/^set -uo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; exit 0 ;;
esac

major() { "$1" --version 2>/dev/null | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p' | head -n 1; }
cf=${CLANG_FORMAT:-}
if [[ -z $cf ]]; then
	if command -v clang-format-14 >/dev/null; then
		cf=clang-format-14
	elif command -v clang-format >/dev/null && [[ $(major clang-format) == 14 ]]; then
		cf=clang-format
	fi
fi
if [[ -z $cf ]] || ! command -v "$cf" >/dev/null; then
	echo "check_format: skipped: no clang-format 14 (apt-get install clang-format-14, or set CLANG_FORMAT)"
	exit 77
fi
if [[ $(major "$cf") != 14 ]]; then
	echo "check_format: skipped: $cf is version $(major "$cf"), not 14 (other versions format differently)"
	exit 77
fi
[[ -f .clang-format ]] || { echo "check_format: no .clang-format in $ROOT"; exit 2; }

# The C sources and headers under each path: tracked ones where this is a git checkout, else all.
list() {
	local p=$1
	if [[ -f $p ]]; then
		echo "$p"
	elif [[ ! -d $p ]]; then
		echo "check_format: no such file or directory: $p" >&2
		return 1
	elif git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -- "$p" | grep -E '\.[ch]$'
	else
		find "$p" -type f -name '*.[ch]' | sort
	fi
}

files=()
paths=("$@")
((${#paths[@]})) || paths=("${DEFAULT_DIRS[@]}")
for p in "${paths[@]}"; do
	out=$(list "$p") || exit 2
	[[ -n $out ]] && mapfile -t -O "${#files[@]}" files <<<"$out"
done

bad=() nlines=0
for f in "${files[@]}"; do
	[[ -f $f ]] || continue	# tracked but deleted in the work tree
	if ! formatted=$("$cf" --style=file "$f" | python3 tests/style/align_comments.py); then
		echo "check_format: $cf failed on $f"
		bad+=("$f")
		continue
	fi
	n=$(diff -U0 "$f" <(printf '%s\n' "$formatted") | grep -c '^-[^-]')
	if ((n)); then
		bad+=("$f")
		nlines=$((nlines + n))
		printf '%6d lines  %s\n' "$n" "$f"
	fi
done
if ((${#bad[@]})); then
	echo "check_format: ${#bad[@]} of ${#files[@]} files differ from $cf's formatting ($nlines lines);" \
		"see: tests/style/format.sh --diff FILE; fix: tests/style/format.sh FILE"
	exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format says ($cf)"
exit 0
