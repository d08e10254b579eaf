"""memhook's memory-type queries through its C ABI, for the PyTorch checks
run under `memhook run`: libmemhook.so, which `memhook run` preloads, is
opened by the path in MEMHOOK_LIB_PATH (the same object, so the same map).
`struct memhook_mem_info` as include/memhook.h defines it."""
import ctypes
import os

HOST, CUDA, UNKNOWN = 0, 1, 15


class MemInfo(ctypes.Structure):
    _fields_ = [("mem_type", ctypes.c_uint32), ("device", ctypes.c_int32),
                ("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_lib = None


def lib():
    """libmemhook.so, opened once."""
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ["MEMHOOK_LIB_PATH"])
    return _lib


def ask(name, ptr, what, length=4096):
    """Calls memhook_memtype_<name> ("lookup" or "classify") over
    [ptr, ptr + length), prints the answer after `what` (None: prints
    nothing), and returns (rc, info)."""
    info = MemInfo()
    fn = getattr(lib(), f"memhook_memtype_{name}")
    rc = fn(ctypes.c_void_p(ptr), ctypes.c_size_t(length), ctypes.byref(info))
    if what is not None:
        print(f"{what}: rc={rc} mem_type={info.mem_type} device={info.device} "
              f"base={info.base or 0:#x} len={info.len}", flush=True)
    return rc, info
