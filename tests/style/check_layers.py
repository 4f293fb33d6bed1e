#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The folders of lib/ form layers: no circle of includes spans folders.

Each file of lib/<folder>/ includes others by their path from lib/ ("cuda/cuda.h"); such an
include is an arrow from its folder to the other. The arrows must form no circle, so that each
folder can be read, and tested, with only the folders below it. A circle is printed with the
includes that make it, and the run fails. On success the folders are printed lowest first.

Usage: check_layers.py [LIB_DIR]   (default: lib/ beside this script's tests/)
"""
import os
import re
import sys

lib = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib")
lib = os.path.normpath(lib)
folders = sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)))
inc = re.compile(r'^\s*#\s*include\s+"([a-z0-9_]+)/[^"]+"', re.M)

# arrows[a][b] = the first "file: include" that makes a -> b
arrows = {f: {} for f in folders}
for f in folders:
    for root, _, files in os.walk(os.path.join(lib, f)):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(root, name)
            with open(path, errors="replace") as fh:
                text = fh.read()
            for m in inc.finditer(text):
                to = m.group(1)
                if to != f and to in arrows and to not in arrows[f]:
                    arrows[f][to] = "%s: #include \"%s/...\"" % (os.path.relpath(path, lib), to)

# depth-first search for a circle
state = {f: 0 for f in folders}  # 0 unseen, 1 on the path, 2 done
order, path = [], []


def visit(f):
    state[f] = 1
    path.append(f)
    for to in sorted(arrows[f]):
        if state[to] == 1:
            circle = path[path.index(to):] + [to]
            print("FAIL: a circle of includes spans the folders of lib/: %s" % " -> ".join(circle))
            for a, b in zip(circle, circle[1:]):
                print("  %s -> %s: %s" % (a, b, arrows[a][b]))
            sys.exit(1)
        if state[to] == 0:
            visit(to)
    path.pop()
    state[f] = 2
    order.append(f)


for f in folders:
    if state[f] == 0:
        visit(f)
if len(folders) < 2:
    print("FAIL: %s has no folders to check" % lib)
    sys.exit(1)
print("ok: the %d folders of lib/ form layers, lowest first: %s" % (len(folders), " ".join(order)))
