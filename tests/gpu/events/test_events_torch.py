#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Events mode against PyTorch's caching allocator, which reaches the driver only through
cuGetProcAddress_v2: zero stale registrations (the differential test's property, checked against
the driver's BUFFER_ID asked here, never the library's answer).

Run with the library preloaded, so that it is in place before torch resolves the driver:
  LD_PRELOAD=build/gpu/lib/libgdrcache.so.0 python3 tests/gpu/events/test_events_torch.py
$GDR_TEST_VALIDATE picks the mode (events, tag, auto); PYTORCH_CUDA_ALLOC_CONF picks torch's
allocator (expandable_segments:True maps with cuMemMap/cuMemUnmap; backend:cudaMallocAsync uses
the stream-ordered pool). Exit 0 pass, 1 fail, 77 skip (no torch, no GPU, events mode refused).
"""
import ctypes
import errno
import os
import random
import sys

try:
    import torch
except ImportError as e:
    print(f"SKIP: no torch ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: torch sees no GPU")
    sys.exit(77)

u64 = ctypes.c_uint64
LIB = os.environ.get("GDRCACHE_LIB", "libgdrcache.so.0")
lib = ctypes.CDLL(LIB)
cuda = ctypes.CDLL("libcuda.so.1")


class Attr(ctypes.Structure):
    _fields_ = [("field_mask", u64), ("max_bytes", u64), ("max_entries", u64),
                ("max_pin_bytes", u64), ("backend", ctypes.c_int32), ("validate", ctypes.c_int32),
                ("reserved0", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


STATS = ["hits", "misses", "stale", "evictions", "pins", "unpins", "pinned_bytes",
         "pinned_bytes_peak", "entries", "passthrough", "tag_checks", "revoked", "sync_memops_set",
         "sync_memops_ctx", "sync_memops_unavailable", "fail_pin", "fail_pin_retried", "fail_mr",
         "fail_cuda", "fail_input", "refused_managed", "overlap_merged", "detached",
         "validate_mode", "events", "events_lost", "fast_hits"]


class Stats(ctypes.Structure):
    # room at the end for fields a newer library adds
    _fields_ = [(n, u64) for n in STATS] + [("_spare", u64 * 64)]


vp = ctypes.c_void_p
lib.gdr_cache_create.argtypes = [ctypes.POINTER(Attr), ctypes.POINTER(vp)]
lib.gdr_reg.argtypes = [vp, vp, vp, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(vp)]
lib.gdr_dereg.argtypes = [vp]
lib.gdr_region_buffer_id.argtypes = [vp, ctypes.POINTER(u64)]
lib.gdr_region_range.argtypes = [vp, ctypes.POINTER(u64), ctypes.POINTER(u64)]
lib.gdr_cache_get_stats_ex.argtypes = [vp, ctypes.POINTER(Stats), ctypes.c_size_t]
lib.gdr_cache_destroy.argtypes = [vp]
cuda.cuPointerGetAttribute.argtypes = [vp, ctypes.c_int, u64]

MODES = {"auto": 0, "tag": 1, "events": 2}  # enum gdr_validate
mode = os.environ.get("GDR_TEST_VALIDATE", "events")
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")
what = f"torch {torch.__version__} [{conf}]"
torch.zeros(1, device="cuda")  # torch resolves the driver and makes its context

attr = Attr(field_mask=1 << 4, validate=MODES[mode])
cache = vp()
rc = lib.gdr_cache_create(ctypes.byref(attr), ctypes.byref(cache))
if rc == -errno.EOPNOTSUPP:
    print(f"SKIP: gdr_cache_create(validate {mode}) = -EOPNOTSUPP: the library does not see "
          "torch's frees")
    sys.exit(77)
if rc:
    print(f"FAIL: gdr_cache_create = {rc}")
    sys.exit(1)

n = {"regs": 0, "same_va": 0, "wrong": 0, "short": 0, "failed": 0, "refused": 0,
     "held_across_free": 0}
# The stream-ordered pool's memory is not GPUDirect RDMA capable: its dma-buf export fails on the
# H100, so a refused registration there is counted apart (it is no stale one).
pool = "cudaMallocAsync" in conf


def driver_id(addr):
    v = ctypes.c_ulonglong(0)
    return v.value if cuda.cuPointerGetAttribute(ctypes.byref(v), 7, addr) == 0 else 0


def reg(addr, length, keep=False):
    r = vp()
    rc = lib.gdr_reg(cache, None, addr, length, 0, ctypes.byref(r))
    if rc:
        n["refused" if pool else "failed"] += 1
        if n["failed"] + n["refused"] <= 5:
            print(f"# gdr_reg({addr:#x}, {length}) = {rc}")
        return None
    n["regs"] += 1
    rid, base, rlen = u64(), u64(), u64()
    lib.gdr_region_buffer_id(r, ctypes.byref(rid))
    lib.gdr_region_range(r, ctypes.byref(base), ctypes.byref(rlen))
    cur = driver_id(addr)
    if not cur or rid.value != cur:
        n["wrong"] += 1
        if n["wrong"] <= 5:
            print(f"# STALE: {addr:#x} region id {rid.value}, driver says {cur}")
    if addr < base.value or addr + length > base.value + rlen.value:
        n["short"] += 1
    if keep:
        return r
    lib.gdr_dereg(r)
    return None


def reg_tensor(t, keep=False):
    nbytes = t.numel() * t.element_size()
    off = random.randrange(0, nbytes) & ~511
    return reg(t.data_ptr() + off, random.randint(1, nbytes - off), keep)


rng = random.Random(5)
random.seed(5)
SIZES = [512, 4096, 100_000, 1 << 20, (1 << 20) + 4096, 2 << 20, 6 << 20, 20 << 20]

# A: the caching allocator hands the same block back (no driver free): hits, same BUFFER_ID.
for i in range(400):
    t = torch.empty(rng.choice(SIZES), dtype=torch.uint8, device="cuda")
    reg_tensor(t)
    reg(t.data_ptr(), t.numel())
    del t

# B: del + empty_cache frees to the driver; the next tensor of the size comes back at the same VA.
held = []
for i in range(300):
    size = rng.choice(SIZES)
    t = torch.empty(size, dtype=torch.uint8, device="cuda")
    p = t.data_ptr()
    r = reg(p, size, keep=(i % 10 == 0))
    if r:
        held.append(r)
        n["held_across_free"] += 1
    del t
    torch.cuda.empty_cache()
    t2 = torch.empty(size, dtype=torch.uint8, device="cuda")
    if t2.data_ptr() == p:
        n["same_va"] += 1
    reg(t2.data_ptr(), size)
    reg_tensor(t2)
    del t2
for r in held:
    lib.gdr_dereg(r)

# C: churn: live tensors of random sizes, random frees, empty_cache now and then.
live = []
for i in range(3000):
    op = rng.random()
    if op < 0.5 and live:
        reg_tensor(rng.choice(live))
    elif op < 0.75 or not live:
        live.append(torch.empty(rng.choice(SIZES), dtype=torch.uint8, device="cuda"))
    else:
        live.pop(rng.randrange(len(live)))
    if i % 100 == 99:
        torch.cuda.empty_cache()
del live
torch.cuda.synchronize()

s = Stats()
lib.gdr_cache_get_stats_ex(cache, ctypes.byref(s), ctypes.sizeof(s))
modes = ["auto", "tag", "events"]  # enum gdr_validate
print(f"{what}: mode asked {mode}: registrations {n['regs']}, reallocations at the same VA "
      f"{n['same_va']}, registrations held across the free {n['held_across_free']}, stale entries "
      f"caught {s.stale + s.events + s.revoked} (stale {s.stale} + free events {s.events} + "
      f"revoked {s.revoked}), wrong {n['wrong']}, short {n['short']}, failed {n['failed']}")
print(f"{what}: stats: validate_mode "
      f"{modes[s.validate_mode] if s.validate_mode < 3 else s.validate_mode}, hits {s.hits}, "
      f"fast_hits {s.fast_hits}, misses {s.misses}, tag_checks {s.tag_checks}, events {s.events}, "
      f"events_lost {s.events_lost}, detached {s.detached}, pins {s.pins}, unpins {s.unpins}")
lib.gdr_cache_destroy(cache)
if n["wrong"] or n["short"] or n["failed"]:
    print(f"FAIL: {what}")
    sys.exit(1)
print(f"PASS: {what}: wrong = 0")
sys.exit(0)
