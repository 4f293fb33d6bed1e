#!/bin/sh
# SPDX-License-Identifier: MIT
# The manual pages (docs/man/gdrcache.man, built into BUILD/man by docs/man/mkman.py): every page
# renders with `man -l` without a single groff or man warning; every function of the public API
# (the GDRCACHE_0.* stanzas of lib/libgdrcache.map) has a page in section 3; the variables of
# gdrcache(7) and of docs/configuration.md's table are exactly lib/common/config.c's table (its
# user variables, as docs/man/mkman.py reads it; their defaults and descriptions:
# check_config_docs.py).
# Usage: check_man.sh BUILD SOURCE [PYTHON]. Exit 0 pass, 1 fail, 77 skip (no man or groff here).
set -u
build=$1 src=$2 python=${3:-python3}
command -v man >/dev/null && command -v groff >/dev/null || { echo "no man/groff"; exit 77; }
fail=0
n=0 bad=0
for page in "$build"/man/man*/*; do
	[ -f "$page" ] || continue
	n=$((n + 1))
	# man resolves .so links relative to the directory above man*/.
	err=$(cd "$build/man" && LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=w -E UTF-8 -l \
		"${page#"$build"/man/}" 2>&1 >/dev/null)
	out=$(cd "$build/man" && LC_ALL=C.UTF-8 MANWIDTH=80 man -E UTF-8 -l "${page#"$build"/man/}" 2>/dev/null | wc -l)
	if [ -n "$err" ] || [ "$out" -lt 8 ]; then
		echo "FAIL: $page: ${err:-only $out lines}"
		bad=$((bad + 1))
	fi
done
[ "$n" -ge 20 ] || { echo "FAIL: only $n pages in $build/man"; fail=1; }
[ $bad = 0 ] && echo "ok: $n pages render without warnings" || fail=1

api=$(awk '/^GDRCACHE_0\.[0-9]+ \{/ { s = 1 } /^\}/ { s = 0 } s && /^[[:space:]]*gdr_[a-z_0-9]*;/ { gsub(/[[:space:];]/, ""); print }' \
	"$src/lib/libgdrcache.map" | sort -u)
missing=0
for f in $api; do
	[ -f "$build/man/man3/$f.3" ] || { echo "FAIL: no page for $f"; missing=1; }
done
[ -n "$api" ] || { echo "FAIL: no API functions in lib/libgdrcache.map"; missing=1; }
[ $missing = 0 ] && echo "ok: a page for each of $(echo "$api" | wc -w) API functions" || fail=1

table=$("$python" "$src/docs/man/mkman.py" --variables "$src/lib/common/config.c" | sort)
man7=$(cd "$build/man" && LC_ALL=C MANWIDTH=200 man -l man7/gdrcache.7 2>/dev/null |
	sed -n '/^ENVIRONMENT/,/^[A-Z]/p' | grep -o '^       GDRCACHE_[A-Z0-9_]*$' | tr -d ' ' | sort)
doc=$(sed -n '/^## Variables/,/^## /p' "$src/docs/configuration.md" | grep -o '^| `GDRCACHE_[A-Z0-9_]*`' |
	grep -o 'GDRCACHE_[A-Z0-9_]*' | sort)
[ -n "$table" ] || { echo "FAIL: no variables in lib/common/config.c's table"; fail=1; }
if [ "$table" != "$man7" ]; then
	echo "FAIL: gdrcache(7) lists other variables than lib/common/config.c:"
	echo "$table" >"$build/man-vars.table"; echo "$man7" >"$build/man-vars.man7"
	diff "$build/man-vars.table" "$build/man-vars.man7"
	fail=1
fi
if [ "$table" != "$doc" ]; then
	echo "FAIL: docs/configuration.md's table lists other variables than lib/common/config.c:"
	echo "$table" >"$build/man-vars.table"; echo "$doc" >"$build/man-vars.doc"
	diff "$build/man-vars.table" "$build/man-vars.doc"
	fail=1
fi
[ $fail = 0 ] && echo "ok: gdrcache(7) and docs/configuration.md list lib/common/config.c's $(echo "$table" | wc -l) variables"
exit $fail
