#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The load-mode matrix's PyTorch worker: torch allocates (torch.empty; a free is del +
torch.cuda.empty_cache(), so that the memory goes back to the driver and the next tensor of the size
comes back at the same VA with a new BUFFER_ID), libgdrcache is loaded with ctypes, and the engine
(lm_core.c: 8 threads registering and checking, freeing and reallocating through these callbacks)
runs in a library ctypes loads, bound to the library ctypes loaded:
  mw             ctypes.CDLL(libmw.so), the middleware that links -lgdrcache, after CUDA init
  ctypes-after   ctypes.CDLL(libgdrcache.so.0) after torch initialised CUDA and allocated
  ctypes-before  ctypes.CDLL(libgdrcache.so.0) before `import torch`
  preload        LD_PRELOAD=libgdrcache.so.0 (set by the caller)
Usage: lm_torch.py MODE LABEL; $LM_BIN holds libmw.so and liblmdyn.so, $LM_GDR_LIB is the library;
PYTORCH_CUDA_ALLOC_CONF picks torch's allocator. Exit 0, 1 (stale or memory test failed), 77 skip.
"""
import ctypes
import os
import sys

mode, label = sys.argv[1], sys.argv[2]
BIN = os.environ["LM_BIN"]
LIB = os.environ.get("LM_GDR_LIB", "libgdrcache.so.0")

gdr = ctypes.CDLL(LIB) if mode == "ctypes-before" else None
try:
    import torch
except ImportError as e:
    print(f"SKIP: no torch ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: torch sees no GPU")
    sys.exit(77)
t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # CUDA initialised, one allocation
del t
torch.cuda.empty_cache()
print(f"# torch {torch.__version__}, PYTORCH_CUDA_ALLOC_CONF="
      f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}", flush=True)

if mode == "mw":
    core = ctypes.CDLL(os.path.join(BIN, "libmw.so"))
    rc = core.lm_bind_direct()
else:
    core = ctypes.CDLL(os.path.join(BIN, "liblmdyn.so"))
    core.lm_bind_handle.argtypes = [ctypes.c_void_p]
    if mode == "preload":
        rc = core.lm_bind_loaded()
    elif mode in ("ctypes-after", "ctypes-before"):
        if gdr is None:
            gdr = ctypes.CDLL(LIB)
        rc = core.lm_bind_handle(gdr._handle)
    else:
        print(f"FAIL: unknown mode {mode}")
        sys.exit(2)
if rc or core.lm_cuda_init():
    print(f"SKIP: mode {mode} could not be set up", flush=True)
    sys.exit(77)

u64 = ctypes.c_uint64
ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, u64, ctypes.POINTER(u64))
FREE = ctypes.CFUNCTYPE(ctypes.c_int, u64, u64)
FLUSH = ctypes.CFUNCTYPE(None)


class Ops(ctypes.Structure):
    _fields_ = [("alloc", ALLOC), ("free", FREE), ("flush", FLUSH)]


live = {}  # data_ptr -> tensor


def c_alloc(size, out):
    try:
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
    except Exception:  # torch.OutOfMemoryError and the like: the engine counts it
        return 1
    p = t.data_ptr()
    live[p] = t
    out[0] = p
    return 0


def c_free(ptr, size):
    try:
        t = live.pop(ptr, None)
        if t is None:
            return 1
        del t
        torch.cuda.empty_cache()
        return 0
    except Exception as e:
        print(f"# free: {e}", flush=True)
        return 1


def c_flush():
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as e:
        print(f"# flush: {e}", flush=True)


ops = Ops(ALLOC(c_alloc), FREE(c_free), FLUSH(c_flush))
pops = ctypes.byref(ops)
for f in ("lm_churn_setup", "lm_churn_run", "lm_churn_teardown", "lm_memtest"):
    getattr(core, f).argtypes = [ctypes.POINTER(Ops)]
core.lm_frees_made.restype = u64
core.lm_report.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p]


def device_frees():
    """The driver frees torch made (cudaFree, cuMemUnmap), when its statistics say."""
    try:
        return torch.cuda.memory_stats().get("num_device_free")
    except Exception:
        return None


if core.lm_churn_setup(pops):
    sys.exit(1)
f0 = device_frees()
core.lm_churn_run(pops)
f1 = device_frees()
core.lm_churn_teardown(pops)
if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
    # every tensor freed is a cudaFreeAsync; torch's statistics do not count them for this backend
    made, src = core.lm_frees_made(), "tensors_freed"
elif f0 is not None and f1 is not None:
    made, src = f1 - f0, "torch.num_device_free"
else:
    made, src = core.lm_frees_made(), "tensors_freed"
core.lm_memtest(pops)
sys.stdout.flush()
sys.exit(core.lm_report(mode.encode(), label.encode(), made, src.encode()))
