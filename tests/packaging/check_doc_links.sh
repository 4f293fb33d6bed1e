#!/bin/sh
# SPDX-License-Identifier: MIT
# Every relative markdown link, `](path)` or `](path#anchor)`, in the project's documents names a
# file or folder that exists, relative to the document's folder. Anchors and URLs are not checked.
# bench/README.md is read only where it exists; the other documents must exist.
# Usage: check_doc_links.sh SOURCE. Exit 0 pass, 1 fail.
set -uf
src=$1
fail=0 n=0
cd "$src" || exit 1
set +f
docs=$(echo README.md CONTRIBUTING.md docs/*.md bench/README.md preload/README.md tests/vm/README.md)
set -f
for doc in $docs; do
	if [ ! -f "$doc" ]; then
		[ "$doc" = bench/README.md ] && continue
		echo "FAIL: no $doc"
		fail=1
		continue
	fi
	dir=$(dirname "$doc")
	for link in $(grep -o ']([^)[:space:]]*)' "$doc" | sed 's/^](//; s/)$//'); do
		case $link in
		*://* | mailto:* | '#'*) continue ;;
		esac
		n=$((n + 1))
		path=${link%%#*}
		[ -e "$dir/$path" ] || { echo "FAIL: $doc: ]($link): no $dir/$path"; fail=1; }
	done
done
[ $fail = 0 ] && echo "ok: $n relative links in the documents name files that exist"
exit $fail
