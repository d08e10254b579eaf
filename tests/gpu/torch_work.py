"""PyTorch's libraries at work: a convolution (cuDNN, which loads its
engine libraries with dlopen as it needs them), a matrix product (cuBLAS
and cuBLASLt) and a backward pass, each checked against the CPU. Run
with and without memhook: memhook's interposed dlopen must leave every
library findable from where its caller looks (a bare name through the
caller's RUNPATH)."""
import os
import sys

import torch

torch.manual_seed(0)
x = torch.randn(8, 16, 32, 32)
w = torch.randn(32, 16, 3, 3, requires_grad=True)
a, b = torch.randn(256, 512), torch.randn(512, 128)
torch.backends.cudnn.enabled = True
# Full fp32 on the GPU (no TF32), so that the CPU's results are the check.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

conv_cpu = torch.nn.functional.conv2d(x, w, padding=1)
conv_gpu = torch.nn.functional.conv2d(x.cuda(), w.cuda(), padding=1)
mm_cpu, mm_gpu = a @ b, a.cuda() @ b.cuda()
wg = w.detach().cuda().requires_grad_(True)
torch.nn.functional.conv2d(x.cuda(), wg, padding=1).square().sum().backward()
torch.nn.functional.conv2d(x, w, padding=1).square().sum().backward()
torch.cuda.synchronize()

errors = [(g.cpu() - c).abs().max().item() / c.abs().max().item()
          for c, g in ((conv_cpu, conv_gpu), (mm_cpu, mm_gpu), (w.grad, wg.grad))]
print("torch_work: largest differences from the CPU, relative:", " ".join(f"{e:.1e}" for e in errors))
ok = all(e < 1e-4 for e in errors)
libs = sorted({l.split()[-1].rsplit("/", 1)[-1] for l in open("/proc/self/maps")
               if ".so" in l and any(k in l for k in ("cudnn", "cublas", "nvrtc", "cudart"))})
print(f"torch_work: cudnn {torch.backends.cudnn.version()} loaded: {' '.join(libs)}")
print("torch_work:", "ok" if ok else "FAILED (results differ)",
      "preload:", os.environ.get("LD_PRELOAD", "none"))
sys.exit(0 if ok else 1)
