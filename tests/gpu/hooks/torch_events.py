# SPDX-License-Identifier: MIT
# Proof on a real GPU that libgdrcache sees every free PyTorch's caching allocator makes (lib/intercept/hooks.c).
# Run with LD_PRELOAD=libgdrcache.so (a Python process cannot be linked with it). Compares the
# segments torch frees (memory_snapshot before/after empty_cache) with the free events seen.
# Exit 0 only if every freed segment was seen; 77 without a GPU.
import ctypes, os, sys
try:
    import torch
except ImportError:
    print("torch: not installed: skip"); sys.exit(77)
if not torch.cuda.is_available():
    print("torch: no GPU: skip"); sys.exit(77)
lib = ctypes.CDLL(os.environ.get("GDR_LIB", "libgdrcache.so.0"))  # the preloaded one
head = lib.gdr_private_events_head; head.restype = ctypes.c_uint64
get = lib.gdr_private_events_get; get.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
probe = lib.gdr_private_events_probe; probe.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
why = ctypes.c_char_p()

def events(seq):
    s, l, out = ctypes.c_uint64(), ctypes.c_uint64(), []
    for q in range(seq, head()):
        rc = get(q, ctypes.byref(s), ctypes.byref(l))
        while rc == -11:
            rc = get(q, ctypes.byref(s), ctypes.byref(l))
        if rc == 0:
            out.append((s.value, l.value))
    return out

def segments():
    return {seg["address"] for seg in torch.cuda.memory_snapshot()}

torch.zeros(1, device="cuda")
rc = probe(ctypes.byref(why))
print(f"torch: probe {rc} ({why.value.decode()})")
bad = rc != 0
total_freed = total_seen = 0
for rnd in range(5):
    sizes = [1 << 12, 1 << 20, 3 << 20, 1 << 24, 100 << 20, 7 << 20]
    ts = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    ptrs = [t.data_ptr() for t in ts]
    before = segments()
    seq = head()
    del ts
    torch.cuda.empty_cache()
    freed = before - segments()
    ev = {s for s, l in events(seq) if l == 0}
    seen = freed & ev
    total_freed += len(freed); total_seen += len(seen)
    again = torch.empty(sizes[4], dtype=torch.uint8, device="cuda")
    print(f"torch: round {rnd}: segments freed {len(freed)} seen {len(seen)}; "
          f"same address again: {again.data_ptr() in ptrs}")
    del again
    torch.cuda.empty_cache()
stats = torch.cuda.memory_stats()
print(f"torch: segments freed {total_freed}, seen {total_seen} "
      f"(allocator's segment.all.freed {stats.get('segment.all.freed')})")
bad |= total_seen != total_freed or total_freed == 0
print("torch:", "FAIL" if bad else "ok")
sys.exit(1 if bad else 0)
