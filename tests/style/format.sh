#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Format C files as tests/style/check_format.sh checks them: clang-format 14 with the tree's
# .clang-format, then tests/style/align_comments.py. Usage: format.sh [--diff] [FILE...]
# (no FILE: the tracked *.c and *.h of lib/ preload/ kmod/ tools/ include/); --diff shows what
# would change instead of changing it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
cf=${CLANG_FORMAT:-clang-format-14}
show=0
[[ ${1:-} == --diff ]] && { show=1; shift; }
(($#)) || set -- $(git ls-files 'lib/*.[ch]' 'preload/*.[ch]' 'kmod/*.[ch]' 'tools/*.[ch]' 'include/*.[ch]')
for f in "$@"; do
	new=$("$cf" --style=file "$f" | python3 tests/style/align_comments.py)
	if ((show)); then
		diff -u "$f" <(printf '%s\n' "$new") || true
	elif [[ $new != "$(cat "$f")" ]]; then
		printf '%s\n' "$new" >"$f"
	fi
done
