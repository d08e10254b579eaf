#!/usr/bin/env bash
# The stack each hooked call takes beyond what it takes unhooked, in the
# optimised libmemhook.so (what programs load), with one empty handler of
# every event: tests/c/stack_use.c measures each host function memhook
# hooks and the CUDA driver's and runtime's (the fake driver of
# tests/cuda/fakecuda.c, the fake runtime of tests/cuda/clients.c):
# allocations and frees of each kind, a module's global and its unload, an
# IPC open and close, a context's teardown), in bistro and in reloc mode, where the
# kernel answers PROCMAP_QUERY (Linux 6.11) and where a seccomp filter
# refuses it as an older kernel does (memhook then reads the text of
# /proc/self/maps, through a buffer on the stack). Fails naming each call
# over its limit (README, "Stack": the limits and the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIPPED: the seccomp filter of tests/c/stack_use.c is x86_64's"
    exit 0
fi
command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc; }
cargo build --release -p memhook-ffi
bash scripts/build-fake-driver.sh target/release
cc -shared -fPIC -O2 -Wall -Werror -DCLIENT_CUDART -Wl,-soname,libcudart.so.13 -o target/release/libcudart.so.13 \
    tests/cuda/clients.c -ldl
cc -O2 -Wall -Werror -I include tests/c/stack_use.c target/release/libcuda.so.1 target/release/libcudart.so.13 \
    -L target/release -lmemhook \
    -Wl,-z,now -Wl,-rpath,"$PWD/target/release" -o target/release/stack-use
# A host call: 2 KiB where the kernel answers PROCMAP_QUERY; 3 KiB where
# memhook reads the text (a kernel before 6.11, or the filter). A CUDA
# call: 1.25 KiB (its hooks never look at the mappings).
status=0
for mode in bistro reloc; do
    for look in query text; do
        args=()
        [ "$look" = text ] && args=(text)
        echo "-- $mode mode${args:+, PROCMAP_QUERY refused}"
        MEMHOOK_MMAP_HOOK_MODE=$mode ./target/release/stack-use 2048 3072 1280 "${args[@]}" || status=1
    done
done
exit $status
