"""Install time in a large process: PyTorch imported and its CUDA
libraries loaded (cuDNN, cuBLAS) before libmemhook.so is loaded with
ctypes and installed through the C ABI: the default configuration, the
host hooks alone in bistro mode, and each CUDA mode and host mode alone. Prints the figures, and
how many of the process's threads memhook moved out of bytes it patched
(or could not check); exits non-zero only if an install fails."""
import ctypes
import os
import sys
import time

import torch

torch.nn.functional.conv2d(torch.randn(1, 1, 8, 8).cuda(), torch.randn(1, 1, 3, 3).cuda())
(torch.randn(64, 64).cuda() @ torch.randn(64, 64).cuda()).sum().item()
torch.cuda.synchronize()
objects = len({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})

t = time.perf_counter()
lib = ctypes.CDLL(os.environ["MEMHOOK_LIB"])
load_ms = (time.perf_counter() - t) * 1e3
lib.memhook_install.argtypes = [ctypes.c_char_p]
results = []
configs = (None, b"mmap=bistro;cuda=none", None, b"cuda=bistro;mmap=none", b"cuda=reloc;mmap=none",
           b"cuda=procaddr;mmap=none", b"mmap=reloc;cuda=none")
for config in configs:
    lib.memhook_uninstall()
    t = time.perf_counter()
    rc = lib.memhook_install(config)
    results.append(((time.perf_counter() - t) * 1e3, rc, config))
threads = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:"))
print(f"install_in_torch: {objects} shared objects mapped, {threads} threads; loading libmemhook.so {load_ms:.2f} ms")
for ms, rc, config in results:
    print(f"install_in_torch: memhook_install({config}) {ms:.2f} ms rc={rc}")
lib.memhook_threads_moved.restype = ctypes.c_uint64
lib.memhook_threads_unchecked.restype = ctypes.c_uint64
print(f"install_in_torch: over the {len(configs)} installs, threads moved out of patched bytes "
      f"{lib.memhook_threads_moved()}, patches written with threads unchecked {lib.memhook_threads_unchecked()}")
sys.exit(0 if all(rc == 0 for _, rc, _ in results) else 1)
