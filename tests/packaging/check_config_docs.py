#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The configuration's two hand-written copies against lib/common/config.c's table, the only place a
variable is named, defaulted and described (gdrcache(7)'s list is generated from it by
docs/man/mkman.py, whose parser of the table this uses):

- the environment comment at the top of include/gdrcache.h: exactly the table's user variables,
  each as "NAME  DESCRIPTION (default DEFAULT)" (wrapped lines joined);
- docs/configuration.md's table (its "## Variables" section): exactly the same variables, each
  row's default cell the table's default and its meaning the table's description, optionally
  followed by details ("; ...", ": ...", ". ...", " (...", ", ..."); backticks are ignored.

Usage: check_config_docs.py SOURCE        exit 0 pass, 1 fail
       check_config_docs.py SOURCE --expect   print the header's lines the table asks for
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__)
sys.path.insert(0, os.path.join(src, "docs", "man"))
import mkman  # noqa: E402  (the one parser of the table)

CONFIG_C = os.path.join(src, "lib", "common", "config.c")
HEADER = os.path.join(src, "include", "gdrcache.h")
CONFIG_MD = os.path.join(src, "docs", "configuration.md")
NAME_COL = 23  # " *   " + the name padded to this width


def header_text(var):
    return "%s (default %s)" % (var["desc"], var["dflt"])


def header_lines(var, width=100):
    """The header's lines for var, wrapped at width."""
    lead, cont = " *   %-*s" % (NAME_COL, var["name"]), " *" + " " * (3 + NAME_COL)
    lines, line = [], lead
    for word in header_text(var).split():
        if line not in (lead, cont) and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = cont
        line += ("" if line in (lead, cont) else " ") + word
    return lines + [line]


def norm(text):
    return " ".join(text.replace("`", "").split())


def header_vars():
    """{name: joined text} of gdrcache.h's environment comment."""
    text = open(HEADER).read()
    start = text.index(" * Environment (")
    out, name = {}, None
    for line in text[start:].split("\n")[1:]:
        m = re.match(r"^ \*   (GDRCACHE_[A-Z0-9_]+)\s+(\S.*)$", line)
        if m:
            name = m.group(1)
            if name in out:
                fail("include/gdrcache.h lists %s twice" % name)
            out[name] = m.group(2)
            continue
        m = re.match(r"^ \*\s{6,}(\S.*)$", line)
        if m and name:
            out[name] += " " + m.group(1)
        elif name or not line.startswith(" * "):
            break  # the end of the list, or of the comment
    return {k: norm(v) for k, v in out.items()}


def doc_vars():
    """{name: (default, meaning)} of docs/configuration.md's table."""
    text = open(CONFIG_MD).read()
    start = text.index("\n## Variables")
    end = text.find("\n## ", start + 1)
    out = {}
    for line in text[start:end if end >= 0 else len(text)].split("\n"):
        m = re.match(r"^\| `(GDRCACHE_[A-Z0-9_]+)` \|(.*?)\|(.*)\|\s*$", line)
        if m:
            if m.group(1) in out:
                fail("docs/configuration.md lists %s twice" % m.group(1))
            out[m.group(1)] = (norm(m.group(2)), norm(m.group(3)))
    return out


failures = []


def fail(what):
    failures.append(what)


def same_names(where, have, want):
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing:
        fail("%s lacks %s (in lib/common/config.c's table)" % (where, ", ".join(missing)))
    if extra:
        fail("%s lists %s: not a user variable of lib/common/config.c's table" % (
            where, ", ".join(extra)))


def main():
    table = mkman.user_variables(CONFIG_C)
    if "--expect" in sys.argv[2:]:
        for var in table:
            print("\n".join(header_lines(var)))
        return 0
    by_name = {v["name"]: v for v in table}

    hdr = header_vars()
    same_names("include/gdrcache.h's environment comment", hdr, by_name)
    for name, text in sorted(hdr.items()):
        var = by_name.get(name)
        if var and text != norm(header_text(var)):
            fail("include/gdrcache.h: %s says\n      %s\n    the table says\n      %s" % (
                name, text, norm(header_text(var))))

    rdm = doc_vars()
    same_names("docs/configuration.md's table", rdm, by_name)
    for name, (dflt, meaning) in sorted(rdm.items()):
        var = by_name.get(name)
        if not var:
            continue
        if dflt != norm(var["dflt"]):
            fail("docs/configuration.md: %s's default is \"%s\", the table's \"%s\"" % (name, dflt,
                                                                       norm(var["dflt"])))
        desc = norm(var["desc"])
        rest = meaning[len(desc):]
        if not meaning.startswith(desc) or not (rest == "" or rest.startswith(
                (";", ":", ".", ",", " ("))):
            fail("docs/configuration.md: %s's meaning does not start with the table's description\n"
                 "      \"%s\"\n    it is\n      \"%s\"" % (name, desc, meaning))

    for f in failures:
        print("FAIL: " + f)
    if failures:
        print("(lib/common/config.c's table is the source: fix the copy, or the table and then "
              "every copy; `%s SOURCE --expect` prints the header's lines)" % sys.argv[0])
        return 1
    print("ok: include/gdrcache.h and docs/configuration.md agree with lib/common/config.c's %d variables "
          "(names, defaults, descriptions)" % len(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
