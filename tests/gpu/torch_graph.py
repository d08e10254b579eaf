"""Run under `memhook run`, with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync:
PyTorch captures a CUDA graph whose output tensor is allocated inside the
capture (cudaMallocAsync on the capturing stream: graph memory, which the
driver makes at each replay). memhook's map (through its C ABI, loaded
with ctypes from the preloaded libmemhook.so) must never say host there:
it says Unknown (or CUDA), and memhook_memtype_classify says CUDA on
device 0 once the graph has run. With the CUDA hooks off the lookup said
host, a wrong type."""
import sys

import torch

from memhook_ctypes import CUDA, UNKNOWN, ask

backend = torch.cuda.get_allocator_backend()
print(f"torch_graph: allocator backend {backend}", flush=True)
if backend != "cudaMallocAsync":
    print("torch_graph: FAILED: run with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
    sys.exit(1)

x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):  # warm-up outside the capture, as PyTorch asks
        y = x * 2 + 1
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 2 + 1  # allocated inside the capture: graph memory
ok = True
for launch in range(3):
    x.fill_(launch)
    g.replay()
    torch.cuda.synchronize()
    value = float(y[-1])
    rc, seen = ask("lookup", y.data_ptr(), f"torch_graph: replay {launch}, lookup")
    ok &= rc == 0 and seen.mem_type in (CUDA, UNKNOWN) and value == 2 * launch + 1
    rc, driver = ask("classify", y.data_ptr(), f"torch_graph: replay {launch}, classify")
    ok &= rc == 0 and driver.mem_type == CUDA and driver.device == 0
del y, g
torch.cuda.synchronize()
print("torch_graph:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
