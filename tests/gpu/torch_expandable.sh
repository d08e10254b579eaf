#!/usr/bin/env bash
# torch_expandable.sh MODE: tests/gpu/torch_expandable.py (PyTorch's
# caching allocator with expandable segments: pages mapped into one
# reserved range by cuMemMap, unmapped by cuMemUnmap when the cache is
# emptied) under `memhook run --json --cuda-mode MODE`, then memhook's
# report checked: the script's lookups passed, and every cuMemMap the
# allocator made was matched by a cuMemUnmap by the end (the script
# empties the cache last). MODE "reloc" only prints what reloc alone saw
# (the allocator's driver calls go through pointers PyTorch looked up,
# not through GOT slots) and exits 0.
set -uo pipefail
mode=$1
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(MEMHOOK_LIB_PATH="$here/libmemhook.so" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    timeout 150 "$here/memhook" run --json --cuda-mode "$mode" -- python3 "$here/src/torch_expandable.py" 2>&1)
echo "$out" | grep "^torch_expandable"
echo "$out" | python3 "$here/src/torch_expandable_report.py" "$mode"
