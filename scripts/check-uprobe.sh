#!/usr/bin/env bash
# memhook's bistro hooks under uprobes put on after the install, as
# bpftrace, bcc's memleak or an eBPF GPU-memory profiler put them: the
# fake driver's cuMemAlloc_v2 and cuMemFree_v2 (driver 580's entries),
# libc's munmap, and libc's getpagesize and iswalpha patched by the
# program itself (memhook_patch; Debian 12's begin with a load of a
# global and with a write of an argument register it never reads), in
# tests/c/under_uprobe.c, driven by
# tests/c/under_uprobe.sh (which says what is checked; the GPU run does
# the same against the real driver). Needs root and a kernel with uprobe
# events; where either is missing, says so and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIPPED: the fake driver's entries here are x86_64's"
    exit 0
fi
out=target/under-uprobe
bash scripts/with-fake-driver.sh tests/c/under_uprobe.c "$out"
bash tests/c/under_uprobe.sh "$out/under-uprobe"
