"""Run under `memhook run` with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(see torch_expandable.sh): PyTorch's caching allocator then reserves one
large address range and maps physical pages into it one at a time
(cuMemCreate + cuMemMap), and unmaps them (cuMemUnmap) when the cache is
emptied. So one tensor can lie across pages mapped by separate calls, and
an address can be mapped, unmapped and mapped again with no allocation
call a hooker of cudaMalloc would see.

Checks, through memhook's C ABI (memhook_ctypes):
  - every MiB of every live tensor is CUDA memory on device 0 in the map,
    each in an entry whose range is the driver's (memhook_memtype_classify
    asks cuPointerGetAttributes), and the tensors lie across more entries
    than there are tensors (pages, not allocations);
  - a lookup over a whole tensor is never host: CUDA where one page holds
    it, else Unknown (it spans pages);
  - a freed tensor's pages stay CUDA while PyTorch keeps them cached;
  - after torch.cuda.empty_cache(), with nothing reserved, no page is CUDA
    in the map (its cuMemUnmap was seen: no stale entry for a cache to
    trust);
  - tensors made again at those addresses are CUDA again.
Prints "torch_expandable: ok" and exits 0 when all hold."""
import os
import sys

import torch

from memhook_ctypes import CUDA, UNKNOWN, ask

MiB = 1 << 20
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"torch_expandable: FAILED: {what}", flush=True)


def lookup(ptr, length=1, quiet=True):
    """memhook_memtype_lookup, printed only where asked."""
    return ask("lookup", ptr, None if quiet else "torch_expandable: lookup", length)


def entries_of(tensors, label):
    """The map's entries under every MiB of `tensors`, checked CUDA on
    device 0 and covering the address looked up."""
    seen = set()
    for t in tensors:
        ptr, n = t.data_ptr(), t.numel() * t.element_size()
        for off in range(0, n, MiB):
            rc, info = lookup(ptr + off)
            ok = (rc == 0 and info.mem_type == CUDA and info.device == 0
                  and info.base <= ptr + off < info.base + info.len)
            expect(ok, f"{label}: {ptr + off:#x} (offset {off} of a {n}-byte tensor) "
                       f"is type {info.mem_type} device {info.device} "
                       f"in [{info.base or 0:#x}, +{info.len})")
            if ok:
                seen.add((info.base, info.len))
        rc, info = lookup(ptr, n)
        expect(rc == 0 and info.mem_type in (CUDA, UNKNOWN),
               f"{label}: the whole tensor at {ptr:#x} (+{n}) is type {info.mem_type}")
    return seen


print(f"torch_expandable: torch {torch.__version__}, "
      f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}", flush=True)
expect("expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
       "run without expandable_segments:True")

# Large-pool tensors (over 1 MiB), each filled and read back.
sizes = [48 * MiB, 30 * MiB, 64 * MiB, 6 * MiB]
tensors = [torch.full((s,), i + 1, dtype=torch.uint8, device="cuda") for i, s in enumerate(sizes)]
torch.cuda.synchronize()
expect(all(int(t.sum().item()) == (i + 1) * t.numel() for i, t in enumerate(tensors)),
       "the tensors' contents")
pages = entries_of(tensors, "live")
print(f"torch_expandable: {len(tensors)} tensors of {sum(sizes) // MiB} MiB lie in "
      f"{len(pages)} mapped range(s) of {sorted({l // MiB for _, l in pages})} MiB; "
      f"reserved {torch.cuda.memory_reserved() // MiB} MiB", flush=True)
expect(len(pages) > len(tensors),
       f"{len(pages)} mapped ranges for {len(tensors)} tensors: expandable segments not in use?")

# Each entry is the driver's range (cuPointerGetAttributes).
for base, length in sorted(pages):
    rc, info = ask("classify", base, None, 1)
    expect(rc == 0 and info.mem_type == CUDA and info.device == 0
           and info.base == base and info.len == length,
           f"the map's [{base:#x}, +{length}) against the driver's "
           f"type {info.mem_type} [{info.base or 0:#x}, +{info.len})")

# Freed but cached: still mapped, still CUDA.
first = tensors[0].data_ptr()
del tensors[0]
torch.cuda.synchronize()
rc, info = lookup(first, quiet=False)
expect(rc == 0 and info.mem_type == CUDA, "a freed tensor's cached page is no longer CUDA")

# The cache emptied: every page unmapped, none left CUDA in the map.
del tensors
torch.cuda.empty_cache()
reserved = torch.cuda.memory_reserved()
expect(reserved == 0, f"{reserved} bytes still reserved after empty_cache")
stale = [(b, l) for b, l in sorted(pages) if lookup(b)[1].mem_type == CUDA]
print(f"torch_expandable: after empty_cache, reserved {reserved}, "
      f"{len(stale)} of {len(pages)} ranges still CUDA in the map", flush=True)
expect(not stale, f"unmapped ranges still CUDA in the map: {[(hex(b), l) for b, l in stale]}")

# Mapped again, at the addresses of the first round or others.
again = [torch.ones(s, dtype=torch.uint8, device="cuda") for s in sizes]
torch.cuda.synchronize()
pages_again = entries_of(again, "again")
reused = len({b for b, _ in pages} & {b for b, _ in pages_again})
print(f"torch_expandable: again, {len(pages_again)} mapped range(s), "
      f"{reused} at an address of the first round", flush=True)
del again
torch.cuda.empty_cache()
stale = [(b, l) for b, l in sorted(pages_again) if lookup(b)[1].mem_type == CUDA]
expect(not stale, f"second round: unmapped ranges still CUDA: {[(hex(b), l) for b, l in stale]}")

print("torch_expandable:", "ok" if not failures else f"FAILED ({len(failures)})",
      "preload:", os.environ.get("LD_PRELOAD", "none"), flush=True)
sys.exit(0 if not failures else 1)
