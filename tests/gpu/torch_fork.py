"""PyTorch's DataLoader forks its workers (the default start method on
Linux) from a process that has used CUDA, while another thread of the
parent keeps the loader busy: it opens and closes a library already
loaded, over and over (under memhook, each call rescans the loaded
objects, holding memhook's locks and walking them under the loader's
`dl_iterate_phdr` lock). Each worker opens the same library too, and
makes tensors. A worker forked while the parent's thread was in that
work would, without memhook's fork handler, find those locks held for
good and hang at its first dlopen. Run with and without memhook: every
epoch must finish, and the batches must be right."""
import ctypes
import ctypes.util
import sys
import threading
import time

import _ctypes
import torch
from torch.utils.data import DataLoader, Dataset

LIBM = ctypes.util.find_library("m")


def look_into_libm():
    h = ctypes.CDLL(LIBM)  # dlopen of a library already loaded
    assert h.cos is not None
    _ctypes.dlclose(h._handle)


class Numbers(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        look_into_libm()
        return torch.full((1024,), float(i))


assert torch.cuda.is_available()
on_gpu = torch.ones(1 << 20, device="cuda")  # the parent has used CUDA
torch.cuda.synchronize()

stop = threading.Event()
rounds = [0]


def churn():
    while not stop.is_set():
        look_into_libm()
        rounds[0] += 1


t = threading.Thread(target=churn)
t.start()
start = time.monotonic()
epochs, workers = 12, 4
try:
    for epoch in range(epochs):
        loader = DataLoader(Numbers(), batch_size=8, num_workers=workers,
                            multiprocessing_context="fork", timeout=120)
        total = sum(batch.sum().item() for batch in loader)
        assert total == 1024 * sum(range(64)), total
finally:
    stop.set()
    t.join()
assert on_gpu.sum().item() == 1 << 20
print(f"torch_fork: {epochs} epochs of {workers} forked workers in "
      f"{time.monotonic() - start:.1f} s beside {rounds[0]} dlopen/dlclose "
      f"rounds on another thread: ok")
sys.exit(0)
