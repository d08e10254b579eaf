"""Run under `memhook run`: PyTorch allocates on the GPU, and memhook's
memory-type map (through its C ABI, loaded with ctypes from the preloaded
libmemhook.so) says the tensor is CUDA memory on device 0."""
import ctypes
import os
import sys

import torch


class MemInfo(ctypes.Structure):
    _fields_ = [("mem_type", ctypes.c_uint32), ("device", ctypes.c_int32),
                ("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


lib = ctypes.CDLL(os.environ["MEMHOOK_LIB_PATH"])
x = torch.empty(1 << 24, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
info = MemInfo()
rc = lib.memhook_memtype_lookup(ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(4096), ctypes.byref(info))
print(f"torch_check: lookup rc={rc} mem_type={info.mem_type} device={info.device} "
      f"base={info.base:#x} len={info.len}")
ok = rc == 0 and info.mem_type == 1 and info.device == 0
print("torch_check:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
