#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/gdrcache_report on records it must read right: a synthetic job (two hosts, four ranks, two
caches in one rank, json and kv, an interval record superseded by the final one, a child of fork,
the preload's record, a truncated last line, a program's own line, one record of an older version
without host, rank, cache id or schema) whose totals, per-rank numbers and worst-first order are
checked exactly, in --json and in the text; then the genuine records of test_stats_output
--two-caches (this build's library, json and kv); exit 1 on no records; --plot without matplotlib
(an import that fails, through PYTHONPATH) exits 2 saying so, and with it writes a PNG.
Usage: test_report.py GDRCACHE_REPORT [TEST_STATS_OUTPUT]"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

tool = sys.argv[1]
stats_prog = sys.argv[2] if len(sys.argv) > 2 else None
tmp = tempfile.mkdtemp(prefix="gdr_report_")


def check(cond, what):
    if not cond:
        print("FAIL: " + what)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(1)


def run(args, python=None, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([python or sys.executable, tool] + args, env=env, capture_output=True,
                       text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def write(name, text):
    path = os.path.join(tmp, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def rec(host, rank, pid, cache, why, mono, **counts):
    r = {"source": "cache", "why": why, "pid": pid, "time": "2026-01-01T00:00:%02d.000Z" % mono,
         "schema": 1, "host": host, "rank": rank, "cache_id": cache, "mono_ns": mono * 10**9,
         "backend": "kmod", "validate": "events"}
    for k in ("hits", "misses", "stale", "evictions", "pins", "unpins", "pinned_bytes", "peak",
              "entries", "revoked", "events", "events_lost"):
        r[k] = counts.get(k, 0)
    if "intercept" in counts:  # schema 2: the interception's numbers, the process's
        r.update(intercept_state=0, intercept_frees_mem_free=counts["intercept"],
                 intercept_frees_ctx=1, intercept_released=2, intercept_deferred=0)
    r["interception"] = ("frees seen: cuMemFree %d cuMemFreeAsync 0 cuMemFreeHost 0 cuMemUnmap 0 "
                         "cuIpcCloseMemHandle 0 context 0; pins released in frees 0, deferred 0; "
                         "out-of-memory reliefs 0 (0 retries succeeded); 1 ns in free hooks"
                         % counts.get("frees", 0))
    return r


def js(r):
    return json.dumps(r) + "\n"


def kv(r):
    out = "gdrcache_stats"
    for k, v in r.items():
        v = str(v)
        out += " %s=%s" % (k, json.dumps(v) if any(c in v for c in ' "=\\') or not v else v)
    return out + "\n"


MiB = 1 << 20
# Rank 0 (nodea): an interval record, then its final one; a child of fork's record (left out).
write("job/nodea/100.json",
      js(rec("nodea", 0, 100, 1, "interval", 1, hits=10, misses=10, peak=MiB)) +
      "a line of the program's own\n" +
      js(rec("nodea", 0, 100, 1, "at exit", 5, hits=90, misses=10, peak=4 * MiB, evictions=2,
             events=5, frees=6)) +
      js(rec("nodea", 0, 102, 1, "at exit, child of fork", 6, hits=500, misses=1)))
# Rank 1 (nodea), kv: two caches (one destroyed, one at exit, with an interval record first) and
# the preload's record.
write("job/nodea/101.kv",
      kv(rec("nodea", 1, 101, 1, "interval", 1, hits=1, misses=1)) +
      kv(rec("nodea", 1, 101, 2, "destroy", 2, hits=30, misses=20, stale=2, revoked=1,
             peak=2 * MiB, events=3, intercept=2)) +
      kv(rec("nodea", 1, 101, 1, "at exit", 4, hits=40, misses=10, stale=1, peak=3 * MiB,
             evictions=1, events=4, events_lost=1, intercept=3)) +
      kv({"source": "preload", "why": "at exit", "pid": 101, "time": "2026-01-01T00:00:04.000Z",
          "host": "nodea", "rank": 1, "mode": "on", "cached": 7, "released": 6,
          "passthrough_host": 3, "passthrough_odp": 1, "fallback": 0}))
# Rank 2 (nodeb): killed mid-write: its last line is cut (it would add 999 hits).
cut = js(rec("nodeb", 2, 200, 1, "interval", 9, hits=999, misses=0))
write("job/nodeb/200.json",
      js(rec("nodeb", 2, 200, 1, "signal", 3, hits=50, misses=50, peak=MiB, events=1)) +
      cut[:len(cut) // 2])
# Rank 3 (nodeb): the hit rate of rank 1 (70%), more stale: before it.
write("job/nodeb/201.json",
      js(rec("nodeb", 3, 201, 7, "at exit", 5, hits=70, misses=30, stale=5, peak=MiB,
             events=2)))
# Two records of an older version (genuine, libgdrcache before host/rank/cache id/schema: pid
# only) of one process with two caches: one destroyed, one alive at exit.
write("job/old.json",
      '{"source": "cache", "why": "destroy", "pid": 8143, "time": "2026-12-07T11:51:54.734Z", '
      '"backend": "dmabuf", "validate": "events", "hits": 2, "misses": 1, "stale": 0, '
      '"evictions": 0, "pins": 1, "unpins": 1, "pinned_bytes": 0, "peak": 1048576, "entries": 0, '
      '"passthrough": 0, "tag_checks": 0, "revoked": 0, "sync_memops": 1, "sync_memops_ctx": 0, '
      '"sync_memops_unavailable": 0, "fail_pin": 0, "fail_pin_retried": 0, "fail_mr": 0, '
      '"fail_cuda": 0, "fail_input": 0, "refused_managed": 0, "overlap_merged": 0, "detached": 0, '
      '"fast_hits": 2, "events": 0, "events_lost": 0, "overlap_split": 0, "exact_mrs": 0, '
      '"exact_replaced": 0, "interception": "frees seen: cuMemFree 3 cuMemFreeAsync 0 '
      'cuMemFreeHost 0 cuMemUnmap 0 cuIpcCloseMemHandle 0 context 0; pins released in frees 0, '
      'deferred 0; out-of-memory reliefs 0 (0 retries succeeded); 13424 ns in free hooks"}\n' +
      '{"source": "cache", "why": "at exit", "pid": 8143, "time": "2026-12-07T11:51:54.735Z", '
      '"backend": "dmabuf", "validate": "events", "hits": 2, "misses": 1, "stale": 0, '
      '"evictions": 0, "pins": 1, "unpins": 0, "pinned_bytes": 1048576, "peak": 1048576, "entries": 1, '
      '"passthrough": 0, "tag_checks": 0, "revoked": 0, "sync_memops": 1, "sync_memops_ctx": 0, '
      '"sync_memops_unavailable": 0, "fail_pin": 0, "fail_pin_retried": 0, "fail_mr": 0, '
      '"fail_cuda": 0, "fail_input": 0, "refused_managed": 0, "overlap_merged": 0, "detached": 0, '
      '"fast_hits": 2, "events": 0, "events_lost": 0, "overlap_split": 0, "exact_mrs": 0, '
      '"exact_replaced": 0, "interception": "frees seen: cuMemFree 3 cuMemFreeAsync 0 '
      'cuMemFreeHost 0 cuMemUnmap 0 cuIpcCloseMemHandle 0 context 0; pins released in frees 0, '
      'deferred 0; out-of-memory reliefs 0 (0 retries succeeded); 13424 ns in free hooks"}\n')
job = os.path.join(tmp, "job")

# ---- --json: the numbers, exactly ----
rc, out, err = run(["--json", os.path.join(job, "nodea"), os.path.join(job, "nodeb", "*.json"),
                    os.path.join(job, "old.json")])
check(rc == 0, "--json: exit %d: %s" % (rc, err))
j = json.loads(out)
check(j["files"] == 5, "files %d" % j["files"])
check(j["records"] == 11, "records %d (10 caches' and the preload's)" % j["records"])
check(j["dropped"] == {"truncated": 1, "unparsable": 0}, "dropped %s" % j["dropped"])
check(j["left_out"]["fork_children"] == 1, "child of fork: %s" % j["left_out"])
check(j["hosts"] == ["nodea", "nodeb"], "hosts %s" % j["hosts"])
t = j["total"]
want = {"hits": 284, "misses": 122, "stale": 8, "revoked": 1, "evictions": 3, "events": 15,
        "events_lost": 1, "peak": 13 * MiB}
for k, v in want.items():
    check(t["counters"][k] == v, "total %s: %d, not %d" % (k, t["counters"][k], v))
check(t["caches"] == 7, "total caches %d" % t["caches"])
check(abs(t["hit_rate"] - 284 / 406) < 1e-9, "total hit rate %s" % t["hit_rate"])
check(t["peak_max_rank"] == 5 * MiB, "largest rank peak %d" % t["peak_max_rank"])
check(t["preload"]["cached"] == 7 and t["preload"]["passthrough_host"] == 3,
      "preload %s" % t["preload"])
check(t["interception"]["frees"] == 13, "frees seen %s" % t["interception"])
check(not [k for k in t["counters"] if k.startswith("intercept_")], "intercept_* summed")
order = [(r["rank"], r["pids"]) for r in j["ranks"]]
check(order == [(2, [200]), (None, [8143]), (3, [201]), (1, [101]), (0, [100])],
      "order (worst first) %s" % order)
per = {r["rank"]: r for r in j["ranks"]}
expect = {0: (90, 10, 0, 0, 4 * MiB, 2, 5, 1), 1: (70, 30, 3, 1, 5 * MiB, 1, 7, 2),
          2: (50, 50, 0, 0, MiB, 0, 1, 1), 3: (70, 30, 5, 0, MiB, 0, 2, 1),
          None: (4, 2, 0, 0, 2 * MiB, 0, 0, 2)}
for rank, (h, m, s, rv, pk, ev, fe, nc) in expect.items():
    c = per[rank]["counters"]
    got = (c["hits"], c["misses"], c["stale"], c["revoked"], c["peak"], c["evictions"],
           c["events"], len(per[rank]["caches"]))
    check(got == (h, m, s, rv, pk, ev, fe, nc), "rank %s: %s, not %s" % (
        rank, got, (h, m, s, rv, pk, ev, fe, nc)))
check(per[1]["hosts"] == ["nodea"] and per[2]["hosts"] == ["nodeb"] and per[None]["hosts"] == [],
      "hosts per rank")
check(sorted(c["counters"]["hits"] for c in per[1]["caches"]) == [30, 40], "rank 1's caches")
check(per[1]["preload"]["cached"] == 7, "rank 1's preload")
check(per[1]["interception"] == {"frees": 4, "released_in_frees": 2, "deferred": 0},
      "rank 1's interception (the process's last record) %s" % per[1]["interception"])

# ---- the text: the same order and numbers, the per-cache lines with -v ----
rc, out, err = run(["-v", job])
check(rc == 0, "text: exit %d: %s" % (rc, err))
lines = out.splitlines()
check(lines[0] == "gdrcache_report: 4 ranks and 1 process without a rank on 2 hosts, 7 caches, "
      "11 records from 5 files", "text head: %s" % lines[0])
check("1 truncated last line dropped" in out and "1 record of children of fork left out" in out,
      "text notes: %s" % out)
check(lines[2].startswith("total: hit rate 70.0% (hits 284, misses 122), peak pinned 13.0 MiB "
      "(largest rank 5.0 MiB), evictions 3, stale 8, revoked 1, free events 15 (lost 1)"),
      "text total: %s" % lines[2])
rows = [ln.split() for ln in lines if ln[:1] in "0123456789-"]
check([r[0] for r in rows] == ["2", "-", "3", "1", "0"], "text order %s" % [r[0] for r in rows])
check(rows[0][:7] == ["2", "nodeb", "200", "1", "50.0%", "50", "50"], "text rank 2: %s" % rows[0])
check(rows[3][:7] == ["1", "nodea", "101", "2", "70.0%", "70", "30"], "text rank 1: %s" % rows[3])
caches = [ln.split() for ln in lines if ln.startswith("  101/")]
check(len(caches) == 2, "-v: rank 1's two caches: %s" % out)
tot = [ln.split() for ln in lines if ln.startswith("total ")][0]
check(tot[:5] == ["total", "7", "70.0%", "284", "122"], "text total row %s" % tot)

# ---- no records: exit 1 ----
empty = write("empty/none.json", "nothing here\n")
rc, out, err = run([empty])
check(rc == 1 and "no records" in err, "no records: exit %d, %s" % (rc, err))
rc, out, err = run([os.path.join(tmp, "nonexistent")])
check(rc == 1, "a missing file: exit %d" % rc)

# ---- genuine records of this build's library ----
if stats_prog:
    real = os.path.join(tmp, "real")
    os.makedirs(real)
    for fmt in ("json", "kv"):
        env = dict(os.environ, GDRCACHE_STATS="file:%s/%%p.%s" % (real, fmt),
                   GDRCACHE_STATS_FORMAT=fmt, GDRCACHE_KMOD_DEV="/nonexistent/gdrcache",
                   GDRCACHE_LOG="error")
        p = subprocess.run([stats_prog, "--two-caches"], env=env, capture_output=True, text=True,
                           check=False)
        check(p.returncode == 0, "test_stats_output --two-caches (%s): %d %s" % (
            fmt, p.returncode, p.stderr))
    rc, out, err = run(["--json", real])
    check(rc == 0, "genuine records: exit %d: %s" % (rc, err))
    j = json.loads(out)
    check(len(j["ranks"]) == 2 and j["total"]["caches"] == 4,
          "genuine: %d ranks, %d caches (two processes of two caches)" % (
              len(j["ranks"]), j["total"]["caches"]))
    c = j["total"]["counters"]
    check((c["hits"], c["misses"], c["stale"], c["peak"]) == (8, 4, 0, 4 * MiB),
          "genuine totals %s" % c)
    check(j["dropped"] == {"truncated": 0, "unparsable": 0}, "genuine: dropped %s" % j["dropped"])

# ---- --plot without matplotlib: 2, said; with it: a PNG ----
shim = os.path.join(tmp, "shim", "matplotlib")
os.makedirs(shim)
with open(os.path.join(shim, "__init__.py"), "w") as f:
    f.write("raise ImportError('matplotlib hidden by test_report.py')\n")
png = os.path.join(tmp, "job.png")
rc, out, err = run(["--plot", png, job], env_extra={"PYTHONPATH": os.path.dirname(shim)})
check(rc == 2 and "--plot needs matplotlib" in err and not os.path.exists(png),
      "--plot without matplotlib: exit %d, %s" % (rc, err))
rc, out, err = run([job], env_extra={"PYTHONPATH": os.path.dirname(shim)})
check(rc == 0 and "total: hit rate 70.0%" in out, "the text report without matplotlib")

plotter = None
for py in [sys.executable, "/usr/bin/python3", shutil.which("python3")]:
    if py and os.path.exists(py) and subprocess.run([py, "-c", "import matplotlib"],
                                                    capture_output=True).returncode == 0:
        plotter = py
        break
if plotter:
    rc, out, err = run(["--plot", png, job], python=plotter)
    check(rc == 0 and os.path.exists(png), "--plot: exit %d, no file: %s" % (rc, err))
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "--plot wrote no PNG")
    plotted = "a PNG plotted (%s)" % plotter
else:
    plotted = "no matplotlib here: the PNG was not tried"

shutil.rmtree(tmp)
print("ok: gdrcache_report's totals, ranks, order, --json, exit 1 on nothing, --plot (%s)"
      % plotted)
