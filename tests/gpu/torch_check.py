"""Run under `memhook run`: PyTorch allocates on the GPU, and memhook's
memory-type map (through its C ABI, loaded with ctypes from the preloaded
libmemhook.so) says the tensor is CUDA memory on device 0."""
import sys

import torch

from memhook_ctypes import CUDA, ask

x = torch.empty(1 << 24, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
rc, info = ask("lookup", x.data_ptr(), "torch_check: lookup")
ok = rc == 0 and info.mem_type == CUDA and info.device == 0
print("torch_check:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
