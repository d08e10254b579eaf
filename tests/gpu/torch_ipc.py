"""Run under `memhook run`: a CUDA tensor shared with another process
(torch.multiprocessing, spawn), which opens it with cudaIpcOpenMemHandle.
memhook's memory-type map in that process (through its C ABI, loaded with
ctypes from the preloaded libmemhook.so) says the tensor is CUDA memory
on device 0; with the IPC open unhooked it said host (absent from the
map)."""
import os
import sys

import torch
import torch.multiprocessing as mp

from memhook_ctypes import CUDA, ask


def consumer(tensors, results):
    t = tensors.get()
    rc, info = ask("lookup", t.data_ptr(), f"torch_ipc: consumer pid {os.getpid()}: lookup of the shared tensor")
    results.put(rc == 0 and info.mem_type == CUDA and info.device == 0 and float(t[-1]) == 7.0)
    del t


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    tensors, results = ctx.Queue(), ctx.Queue()
    x = torch.full((1 << 22,), 7.0, device="cuda")
    torch.cuda.synchronize()
    p = ctx.Process(target=consumer, args=(tensors, results))
    p.start()
    tensors.put(x)
    ok = results.get(timeout=180)
    p.join(timeout=180)
    print("torch_ipc:", "ok" if ok else "FAILED")
    sys.exit(0 if ok and p.exitcode == 0 else 1)
