#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""After clang-format: align the continuation lines of trailing comments with their comment's text.

clang-format (ReflowComments off, which keeps the tables and lists of our comments) moves a
trailing comment's first line to its aligned column but leaves the comment's further lines where
they were. This puts them back under the text of the first line ("/* " + 3), as the code is
written; lines that begin with "*" go under the "*" of "/*". Reads stdin, writes stdout.
Used by tests/style/check_format.sh (the check) and tests/style/format.sh (the fix).
"""
import sys

TAB = 8


def col(s, i):
    """Visual column of s[i] with tabs of TAB."""
    c = 0
    for ch in s[:i]:
        c = (c // TAB + 1) * TAB if ch == '\t' else c + 1
    return c


def indent(n):
    return '\t' * (n // TAB) + ' ' * (n % TAB)


def trailing_comment(line):
    """Index of a '/*' that follows code on this line and is not closed on it, else -1."""
    q = None
    i = 0
    while i < len(line):
        ch = line[i]
        if q:
            if ch == '\\':
                i += 2
                continue
            if ch == q:
                q = None
        elif ch in '"\'':
            q = ch
        elif line.startswith('//', i):
            return -1
        elif line.startswith('/*', i):
            end = line.find('*/', i + 2)
            if end < 0:
                return i if line[:i].strip() else -1
            i = end + 2
            continue
        i += 1
    return -1


def main():
    out = []
    target = None
    for line in sys.stdin.read().split('\n'):
        if target is not None:
            body = line.lstrip(' \t')
            if body and not line.rstrip().endswith('\\'):
                line = indent(target + (1 if body.startswith('*') else 3)) + body
            if '*/' in line:
                target = None
        else:
            i = trailing_comment(line)
            if i >= 0 and not line.rstrip().endswith('\\'):
                target = col(line, i)
        out.append(line)
    sys.stdout.write('\n'.join(out))


main()
