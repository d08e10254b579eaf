"""Run under `memhook run`: NCCL, the communication library memhook is
made for, at work in PyTorch's process group (one rank, on device 0, its
store a file: no network). NCCL maps its own buffers with cuMemCreate and
cuMemMap, through driver entry points it asks the runtime for
(cudaGetDriverEntryPoint, which is cuGetProcAddress), not through the
driver's exported symbols.

Checked: the collectives give the right answers with memhook installed;
memhook's map says CUDA on device 0 for a tensor the collectives wrote;
and, where PyTorch has NCCL's own allocator (ncclMemAlloc, a cuMem
mapping made inside NCCL), for a tensor in that memory too, and no
longer CUDA once NCCL has freed it. ncclMemAlloc and ncclMemFree are
also called directly, through ctypes on the libnccl PyTorch loaded
(PyTorch's wheels may lack the allocator above): the whole allocation
is CUDA on device 0 while it lives and no longer once freed; with the
CUDA hooks in reloc mode alone, which NCCL's driver calls bypass, the
map must not know it (the miss asserted, as the mode matrix does). The
events memhook saw are in `memhook run`'s report, which the calling
script checks."""
import ctypes
import glob
import os
import site
import sys
import tempfile

import torch
import torch.distributed as dist

from memhook_ctypes import CUDA, ask

ok = True
# The mode `memhook run --cuda-mode` set: reloc alone cannot see NCCL's
# driver calls (entry points from cuGetProcAddress, not GOT slots).
RELOC_ONLY = [m.strip() for m in os.environ.get("MEMHOOK_CUDA_HOOK_MODE", "").split(",")] == ["reloc"]


def expect(what, cond):
    global ok
    print(f"torch_nccl: {what}: {'ok' if cond else 'FAILED'}", flush=True)
    ok = ok and cond


def expect_nccl_mapping(what, rc, info):
    """A lookup of memory NCCL mapped itself: CUDA on device 0, or, with
    reloc alone, unknown to the map (NCCL's driver calls bypass GOT
    slots)."""
    if RELOC_ONLY:
        expect(f"reloc alone: {what} unknown to the map", rc != 0 or info.mem_type != CUDA)
    else:
        expect(f"{what} is CUDA on device 0", rc == 0 and info.mem_type == CUDA and info.device == 0)


def nccl_library():
    """The libnccl this process uses: by its soname (found already loaded,
    PyTorch's), else the one of the nvidia-nccl wheel; None where neither
    opens."""
    names = ["libnccl.so.2", "libnccl.so"]
    for d in site.getsitepackages():
        names += sorted(glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def nccl_mem_alloc_directly():
    """ncclMemAlloc's memory in the map while it lives, and not after
    ncclMemFree (reloc alone: never)."""
    nccl = nccl_library()
    if nccl is None or not hasattr(nccl, "ncclMemAlloc"):
        print("torch_nccl: no ncclMemAlloc in this process: direct call not checked", flush=True)
        return
    nccl.ncclMemAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    nccl.ncclMemFree.argtypes = [ctypes.c_void_p]
    size = 8 << 20
    p = ctypes.c_void_p()
    rc = nccl.ncclMemAlloc(ctypes.byref(p), size)
    expect(f"ncclMemAlloc of {size} bytes called directly (rc {rc})", rc == 0 and bool(p.value))
    if rc != 0 or not p.value:
        return
    at = p.value
    rc, info = ask("lookup", at, "torch_nccl: lookup of all of ncclMemAlloc's memory", length=size)
    expect_nccl_mapping("all of ncclMemAlloc's memory", rc, info)
    rc = nccl.ncclMemFree(at)
    expect(f"ncclMemFree (rc {rc})", rc == 0)
    rc, info = ask("lookup", at, "torch_nccl: lookup after ncclMemFree called directly")
    expect("no longer CUDA after ncclMemFree called directly", rc != 0 or info.mem_type != CUDA)


print(f"torch_nccl: torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}",
      flush=True)
torch.cuda.set_device(0)
with tempfile.TemporaryDirectory() as d:
    dist.init_process_group("nccl", init_method=f"file://{d}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    dist.all_reduce(x)
    y = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    dist.all_gather_into_tensor(y, x)
    dist.broadcast(y, src=0)
    torch.cuda.synchronize()
    want = torch.arange(1 << 20, dtype=torch.float32)
    expect("all_reduce, all_gather and broadcast on one rank", torch.equal(y.cpu(), want))
    rc, info = ask("lookup", y.data_ptr(), "torch_nccl: lookup of the collectives' output")
    expect("the output is CUDA memory on device 0", rc == 0 and info.mem_type == CUDA and info.device == 0)

    # NCCL's own allocator (PyTorch 2.6 and later): memory NCCL maps
    # itself with cuMemCreate and cuMemMap.
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda", 0))
    try:
        allocator = backend.mem_allocator
    except (AttributeError, RuntimeError) as e:  # "not supported in this NCCL version"
        print(f"torch_nccl: no NCCL allocator: {e}", flush=True)
        allocator = None
    if allocator is not None and hasattr(torch.cuda, "MemPool"):
        pool = torch.cuda.MemPool(allocator)
        with torch.cuda.use_mem_pool(pool):
            z = torch.ones(1 << 22, dtype=torch.float32, device="cuda")
        dist.all_reduce(z)
        torch.cuda.synchronize()
        expect("all_reduce in ncclMemAlloc memory", bool((z == 1).all()))
        at = z.data_ptr()
        rc, info = ask("lookup", at, "torch_nccl: lookup of a tensor in ncclMemAlloc memory")
        expect_nccl_mapping("ncclMemAlloc memory", rc, info)
        del z
        del pool  # its blocks go back to NCCL (ncclMemFree)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rc, info = ask("lookup", at, "torch_nccl: lookup after ncclMemFree")
        expect("no longer CUDA after ncclMemFree", rc != 0 or info.mem_type != CUDA)
    else:
        print("torch_nccl: no tensor in PyTorch's NCCL allocator (ncclMemAlloc is called directly below)", flush=True)
    nccl_mem_alloc_directly()
    dist.destroy_process_group()

print("torch_nccl:", "ok" if ok else "FAILED", "preload:", os.environ.get("LD_PRELOAD", "none"), flush=True)
sys.exit(0 if ok else 1)
