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
longer CUDA once NCCL has freed it. The events memhook saw are in
`memhook run`'s report, which the calling script checks."""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

from memhook_ctypes import CUDA, ask

ok = True


def expect(what, cond):
    global ok
    print(f"torch_nccl: {what}: {'ok' if cond else 'FAILED'}", flush=True)
    ok = ok and cond


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
        expect("ncclMemAlloc memory is CUDA on device 0", rc == 0 and info.mem_type == CUDA and info.device == 0)
        del z
        del pool  # its blocks go back to NCCL (ncclMemFree)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rc, info = ask("lookup", at, "torch_nccl: lookup after ncclMemFree")
        expect("no longer CUDA after ncclMemFree", rc != 0 or info.mem_type != CUDA)
    else:
        print("torch_nccl: ncclMemAlloc memory not checked", flush=True)
    dist.destroy_process_group()

print("torch_nccl:", "ok" if ok else "FAILED", "preload:", os.environ.get("LD_PRELOAD", "none"), flush=True)
sys.exit(0 if ok else 1)
