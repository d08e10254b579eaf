#!/usr/bin/env bash
# torch_nccl.sh MODE: tests/gpu/torch_nccl.py (NCCL in PyTorch's process
# group) under `memhook run --json --cuda-mode MODE`, and memhook's report
# checked. NCCL maps its buffers with cuMemCreate and cuMemMap through
# driver entry points it gets from cuGetProcAddress (cudaGetDriverEntryPoint
# of the runtime it links statically), so:
#   bistro, procaddr and the default each see every cuMemMap NCCL makes
#   and, by destroy_process_group, as many cuMemUnmap (no lost free), and
#   the collectives' output is CUDA memory in the map;
#   reloc alone, which rewrites only GOT slots, sees none of them.
# Exit 0 when MODE saw what it must.
set -uo pipefail
mode=$1
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(MEMHOOK_LIB_PATH="$here/libmemhook.so" timeout 150 "$here/memhook" run --json --cuda-mode "$mode" \
    -- python3 "$here/src/torch_nccl.py" 2>&1)
echo "$out" | grep "^torch_nccl"
echo "$out" | python3 "$here/src/torch_nccl_report.py" "$mode"
