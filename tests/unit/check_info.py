#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gdrcache_info against the fake driver: its JSON parses; the validation mode it reports is the
probe's verdict (events where the interception is proven, tag otherwise), the interception's state
as its number and its name; each GPU as fields; every variable is listed with value, default and
form; a malformed variable makes it report the refusal, naming the variable, the string given and
the form it must take, in text and JSON, and exit 1; --version prints the VERSION file's version;
-h and --help print the usage on stdout and exit 0; an unknown option, on stderr with exit 2.
Usage: check_info.py GDRCACHE_INFO FAKE_LIBCUDA BADENTRY_LIBCUDA"""
import json
import os
import subprocess
import sys

info, fake, bad = sys.argv[1:4]
version_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "VERSION")


def run_raw(args, libcuda=fake, extra=None):
    env = dict(os.environ, GDRCACHE_LIBCUDA=libcuda, GDRCACHE_KMOD_DEV="/nonexistent",
               GDRCACHE_LOG="error")
    env.pop("GDRCACHE_MAX_BYTES", None)
    env.update(extra or {})
    return subprocess.run([info] + args, env=env, capture_output=True, text=True, check=False)


def run(libcuda, extra=None):
    p = run_raw(["--json"], libcuda, extra)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError as e:
        check(False, "--json does not parse (%s): %r" % (e, p.stdout[:500]))


def check(cond, what):
    if not cond:
        print("FAIL: " + what)
        sys.exit(1)


# Options.
with open(version_file) as f:
    version = f.read().strip()
p = run_raw(["--version"])
check(p.returncode == 0 and version in p.stdout.split(),
      "--version: exit %d, %r (VERSION says %s)" % (p.returncode, p.stdout, version))
for opt in ("-h", "--help"):
    p = run_raw([opt])
    check(p.returncode == 0 and p.stdout.startswith("usage: gdrcache_info") and "--json" in p.stdout
          and not p.stderr, "%s: exit %d, stdout %r, stderr %r" % (opt, p.returncode, p.stdout,
                                                                     p.stderr))
p = run_raw(["--no-such-option"])
check(p.returncode == 2 and "usage: gdrcache_info" in p.stderr and not p.stdout,
      "unknown option: exit %d, stdout %r, stderr %r" % (p.returncode, p.stdout, p.stderr))

# Over the fake driver: proven, events, the GPUs as fields, the configuration.
rc, j = run(fake)
check(rc == 0, "exit status %d" % rc)
it = j["interception"]
check(it["state"] == 0 and it["state_name"] == "proven", "interception not proven: %s" % it)
check(j["cache"]["validation"] == "events", "validation %s" % j["cache"]["validation"])
check(j["cuda"]["devices"] >= 1, "no device")
gpus = j["cuda"]["gpus"]
check(isinstance(gpus, list) and len(gpus) == j["cuda"]["devices"], "gpus: %s" % gpus)
for i, g in enumerate(gpus):
    check(g["index"] == i and isinstance(g["dma_buf"], bool) and
          isinstance(g["gpudirect_rdma"], bool), "gpu %d: %s" % (i, g))
for name in ("GDRCACHE_LOG", "GDRCACHE_MAX_BYTES", "GDRCACHE_BACKEND", "GDRCACHE_VALIDATE",
             "GDRCACHE_LIBCUDA"):
    v = j["config"][name]
    check({"value", "default", "set", "form", "malformed"} <= set(v), "%s incomplete" % name)
    check(v["malformed"] is False, "%s reported malformed" % name)
check(j["config"]["GDRCACHE_LIBCUDA"]["set"] and j["config"]["GDRCACHE_LIBCUDA"]["value"] == fake,
      "GDRCACHE_LIBCUDA not reported as set")
form = j["config"]["GDRCACHE_MAX_BYTES"]["form"]
check(form, "GDRCACHE_MAX_BYTES has no form")
p = run_raw([])
check(p.returncode == 0 and "gpu0:" in p.stdout and "proven: " in p.stdout,
      "text over the fake: %r" % p.stdout)

rc, j = run(bad)  # an entry the patcher refuses: the probe fails, tag
it = j["interception"]
check(rc == 0 and isinstance(it["state"], int) and it["state"] < 0, "bad entry: state %s" % it)
check(it["state_name"] == "unavailable" and it["errno_name"].startswith("E"),
      "bad entry: state named %s" % it)
check("cuMemFree_v2" in it["reason"], "bad entry: reason %s" % it)
check(j["cache"]["validation"] == "tag", "bad entry: validation %s" % j["cache"]["validation"])

# No driver: the state by name, in JSON and text, not a bare -19.
nodrv = "/nonexistent/libcuda.so.1"
rc, j = run(nodrv)
it = j["interception"]
check(it["state"] == -19 and it["errno_name"] == "ENODEV" and it["state_name"] == "unavailable",
      "no driver: %s" % it)
p = run_raw([], nodrv)
check("unavailable: no CUDA driver (ENODEV)" in p.stdout and "-19" not in p.stdout,
      "no driver, text: %r" % p.stdout)

# A malformed variable: refused, named with the string given and the form, in JSON and text.
rc, j = run(fake, {"GDRCACHE_MAX_BYTES": "abc"})
c, v = j["cache"], j["config"]["GDRCACHE_MAX_BYTES"]
check(rc == 1 and "error" in c, "malformed variable not reported")
check(c["errno"] == -22 and c["errno_name"] == "EINVAL", "malformed: %s" % c)
check(c["malformed"] == {"variable": "GDRCACHE_MAX_BYTES", "given": "abc", "form": form},
      "malformed: %s" % c)
check(all(s in c["error"] for s in ("GDRCACHE_MAX_BYTES", '"abc"', form)), "error %r" % c["error"])
check(v["value"] == "abc" and v["set"] and v["malformed"] is True, "config row: %s" % v)
check(not j["config"]["GDRCACHE_MAX_ENTRIES"]["malformed"], "another variable flagged malformed")
for args in ([], ["-c"]):
    p = run_raw(args, fake, {"GDRCACHE_MAX_BYTES": "abc"})
    lines = [l for l in p.stdout.splitlines()
             if "GDRCACHE_MAX_BYTES" in l and '"abc"' in l and form in l]
    check(p.returncode == 1 and len(lines) == 1 + len(args),
          "text %s: exit %d, %r" % (args, p.returncode, p.stdout))
print("ok: gdrcache_info: options, the probe's mode and state by name, the GPUs, the "
      "configuration, and refusals naming the variable")
