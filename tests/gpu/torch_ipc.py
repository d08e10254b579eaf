"""Run under `memhook run`: a CUDA tensor shared with another process
(torch.multiprocessing, spawn), which opens it with cudaIpcOpenMemHandle.
memhook's memory-type map in that process (through its C ABI, loaded with
ctypes from the preloaded libmemhook.so) says the tensor is CUDA memory
on device 0; with the IPC open unhooked it said host (absent from the
map)."""
import ctypes
import os
import sys

import torch
import torch.multiprocessing as mp


class MemInfo(ctypes.Structure):
    _fields_ = [("mem_type", ctypes.c_uint32), ("device", ctypes.c_int32),
                ("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def consumer(tensors, results):
    t = tensors.get()
    lib = ctypes.CDLL(os.environ["MEMHOOK_LIB_PATH"])
    info = MemInfo()
    rc = lib.memhook_memtype_lookup(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(4096), ctypes.byref(info))
    print(f"torch_ipc: consumer pid {os.getpid()}: lookup of the shared tensor rc={rc} "
          f"mem_type={info.mem_type} device={info.device} base={info.base or 0:#x} len={info.len}",
          flush=True)
    results.put(rc == 0 and info.mem_type == 1 and info.device == 0 and float(t[-1]) == 7.0)
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
