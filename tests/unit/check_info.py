#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gdrcache_info against the fake driver: its JSON parses; the validation mode it reports is the
probe's verdict (events where the interception is proven, tag otherwise); every variable is listed
with value, default and form; a malformed variable makes it report the refusal and exit 1.
Usage: check_info.py GDRCACHE_INFO FAKE_LIBCUDA BADENTRY_LIBCUDA"""
import json
import os
import subprocess
import sys

info, fake, bad = sys.argv[1:4]


def run(libcuda, extra=None):
    env = dict(os.environ, GDRCACHE_LIBCUDA=libcuda, GDRCACHE_KMOD_DEV="/nonexistent",
               GDRCACHE_LOG="error")
    env.update(extra or {})
    p = subprocess.run([info, "--json"], env=env, capture_output=True, text=True, check=False)
    return p.returncode, json.loads(p.stdout)


def check(cond, what):
    if not cond:
        print("FAIL: " + what)
        sys.exit(1)


rc, j = run(fake)
check(rc == 0, "exit status %d" % rc)
check(j["interception"]["state"] == 0, "interception not proven over the fake")
check(j["cache"]["validation"] == "events", "validation %s" % j["cache"]["validation"])
check(j["cuda"]["devices"] >= 1, "no device")
for name in ("GDRCACHE_LOG", "GDRCACHE_MAX_BYTES", "GDRCACHE_BACKEND", "GDRCACHE_VALIDATE",
             "GDRCACHE_LIBCUDA"):
    v = j["config"][name]
    check({"value", "default", "set", "form"} <= set(v), "%s incomplete" % name)
check(j["config"]["GDRCACHE_LIBCUDA"]["set"] and j["config"]["GDRCACHE_LIBCUDA"]["value"] == fake,
      "GDRCACHE_LIBCUDA not reported as set")

rc, j = run(bad)  # an entry the patcher refuses: the probe fails, tag
check(rc == 0 and j["interception"]["state"] != 0, "bad entry: interception reported proven")
check("cuMemFree_v2" in j["interception"]["reason"], "bad entry: reason %s" % j["interception"])
check(j["cache"]["validation"] == "tag", "bad entry: validation %s" % j["cache"]["validation"])

rc, j = run(fake, {"GDRCACHE_MAX_BYTES": "lots"})
check(rc == 1 and "error" in j["cache"], "malformed variable not reported")
print("ok: gdrcache_info --json reports the probe's mode, the configuration, and refusals")
