#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Free interception when libgdrcache is loaded by Python's ctypes (a Python extension's way),
after the program has initialised "CUDA" (the fake driver, GDRCACHE_LIBCUDA) and resolved its free
functions. Threads register, check and free buffers at reused VAs, as ev_prog.c does.
Usage: ev_ctypes.py LIBGDRCACHE. Exit 0 pass, 1 fail."""
import ctypes as C
import os
import random
import sys
import threading

GDR_VALIDATE_EVENTS = 2  # enum gdr_validate (0.2 on: AUTO 0, TAG 1, EVENTS 2)
ROUTES = 6


class Stats(C.Structure):
    _fields_ = [("state", C.c_int32), ("reason", C.c_char * 116),
                ("frees", C.c_uint64 * ROUTES), ("released", C.c_uint64),
                ("deferred", C.c_uint64), ("reg_waits", C.c_uint64),
                ("oom_relief", C.c_uint64), ("oom_retry_ok", C.c_uint64),
                ("free_ns", C.c_uint64)]


def main():
    cuda = C.CDLL(os.environ["GDRCACHE_LIBCUDA"])
    gpa = cuda.cuGetProcAddress_v2
    gpa.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64,
                    C.POINTER(C.c_int)]

    def proc(name, version, flags=0):
        p, st = C.c_void_p(), C.c_int()
        gpa(name.encode(), C.byref(p), version, flags, C.byref(st))
        return p.value

    init = C.CFUNCTYPE(C.c_int, C.c_uint)(proc("cuInit", 2000))
    alloc = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_uint64), C.c_size_t)(proc("cuMemAlloc", 3020))
    free = C.CFUNCTYPE(C.c_int, C.c_uint64)(proc("cuMemFree", 3020))
    buffer_id = cuda.fake_cuda_buffer_id
    buffer_id.restype, buffer_id.argtypes = C.c_uint64, [C.c_uint64]
    if init(0):
        return "cuInit failed"

    gdr = C.CDLL(sys.argv[1])  # after CUDA: the free pointer above predates the library
    cache = C.c_void_p()
    if gdr.gdr_cache_create(None, C.byref(cache)):
        return "gdr_cache_create failed"
    st = (C.c_uint64 * 64)()  # room past struct gdr_cache_stats: zeros there
    if gdr.gdr_cache_get_stats_ex(cache, st, C.c_size_t(C.sizeof(st))) or st[63]:
        return "gdr_cache_get_stats_ex failed"
    mode = st[23]  # validate_mode: the 24th counter of struct gdr_cache_stats
    ist = Stats()
    gdr.gdr_intercept_get_stats(C.byref(ist), C.sizeof(ist))
    print("validation mode %s; interception: %d (%s)" %
          ("events" if mode == GDR_VALIDATE_EVENTS else "tag", ist.state, ist.reason.decode()))
    if mode != GDR_VALIDATE_EVENTS or ist.state:
        return "validation mode is not events"
    seen0 = ist.frees[0]

    slots = [[threading.Lock(), 0] for _ in range(32)]
    counts = {"regs": 0, "stale": 0, "frees": 0, "errors": 0}
    lock = threading.Lock()

    def alloc_slot(s):
        p = C.c_uint64()
        if alloc(C.byref(p), random.choice([4096, 65536, 1 << 20, 3 << 20])):
            with lock:
                counts["errors"] += 1
        s[1] = p.value

    for s in slots:
        alloc_slot(s)

    def worker(seed):
        rnd = random.Random(seed)
        for _ in range(int(os.environ.get("EV_OPS", "20000")) // 4):
            s = rnd.choice(slots)
            with s[0]:
                if rnd.random() < 0.125:
                    free(s[1])
                    with lock:
                        counts["frees"] += 1
                    alloc_slot(s)
                    continue
                reg = C.c_void_p()
                if gdr.gdr_reg(cache, None, C.c_void_p(s[1]), C.c_size_t(4096), 0,
                               C.byref(reg)):
                    with lock:
                        counts["errors"] += 1
                    continue
                rid = C.c_uint64()
                gdr.gdr_region_buffer_id(reg, C.byref(rid))
                with lock:
                    counts["regs"] += 1
                    if rid.value != buffer_id(s[1]):
                        counts["stale"] += 1
                gdr.gdr_dereg(reg)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in slots:
        free(s[1])
        counts["frees"] += 1
    gdr.gdr_intercept_get_stats(C.byref(ist), C.sizeof(ist))
    seen = ist.frees[0] - seen0
    print("%d registrations, %d stale, %d frees made, %d seen, %d errors" %
          (counts["regs"], counts["stale"], counts["frees"], seen, counts["errors"]))
    if gdr.gdr_cache_destroy(cache):
        return "gdr_cache_destroy failed"
    if counts["stale"] or counts["errors"]:
        return "stale registrations or errors"
    if seen != counts["frees"]:
        return "frees seen differ from frees made"
    return None


if __name__ == "__main__":
    err = main()
    if err:
        print("FAIL: " + err)
        sys.exit(1)
