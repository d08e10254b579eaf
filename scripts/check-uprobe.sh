#!/usr/bin/env bash
# memhook's bistro hooks under uprobes put on after the install, as
# bpftrace, bcc's memleak or an eBPF GPU-memory profiler put them
# (tests/c/under_uprobe.c says what is checked): through tracefs, on the
# fake driver's cuMemAlloc_v2 and cuMemFree_v2 (driver 580's entries)
# and on libc's munmap. Every allocation, free and unmap must be seen
# and every call succeed before the probes, while they are on (each hit
# once a call) and after they came off. Needs root and a kernel with
# uprobe events; where either is missing, says so and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIPPED: the fake driver's entries here are x86_64's"
    exit 0
fi
tracefs=
mounted=
for d in /sys/kernel/tracing /sys/kernel/debug/tracing; do
    if [ -e "$d/uprobe_events" ]; then tracefs=$d; break; fi
done
if [ -z "$tracefs" ] && [ "$(id -u)" = 0 ]; then
    mounted=$(mktemp -d)
    if mount -t tracefs nodev "$mounted" 2>/dev/null && [ -e "$mounted/uprobe_events" ]; then
        tracefs=$mounted
    else
        rmdir "$mounted"
        mounted=
    fi
fi
if [ -z "$tracefs" ] || ! [ -w "$tracefs/uprobe_events" ]; then
    echo "SKIPPED: no writable uprobe_events here (needs root and CONFIG_UPROBE_EVENTS)"
    exit 0
fi
command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc; }
cargo build -p memhook-ffi
out=target/under-uprobe
mkdir -p "$out"
cc -shared -fPIC -O2 -Wall -Werror -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" tests/cuda/fakecuda.c -lpthread
cc -O2 -Wall -Werror -I include tests/c/under_uprobe.c "$out/libcuda.so.1" -L target/debug -lmemhook \
    -Wl,-rpath,"$PWD/target/debug" -Wl,-rpath,"$PWD/$out" -o "$out/under-uprobe"

group=memhookcheck$$
log="$out/run.log"
rm -f "$out/ctl" "$log"
mkfifo "$out/ctl"
probes=()
cleanup() {
    exec 3>&- 2>/dev/null || true
    if [ -e "$tracefs/events/$group/enable" ]; then echo 0 >"$tracefs/events/$group/enable" || true; fi
    for p in "${probes[@]}"; do echo "-:$group/$p" >>"$tracefs/uprobe_events" 2>/dev/null || true; done
    if [ -n "$mounted" ]; then umount "$mounted" && rmdir "$mounted"; fi
    rm -f "$out/ctl"
}
trap cleanup EXIT
fail() { echo "check-uprobe: $*" >&2; cat "$log" >&2; exit 1; }
MEMHOOK_CUDA_HOOK_MODE=bistro MEMHOOK_MMAP_HOOK_MODE=bistro "$out/under-uprobe" <"$out/ctl" >"$log" 2>&1 &
pid=$!
exec 3>"$out/ctl"
# Waits (up to 60 s) for a line of the log matching $1, or the program's end.
await() {
    for _ in $(seq 600); do
        grep -qE "$1" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || { grep -qE "$1" "$log" && return 0; fail "the program ended before '$1'"; }
        sleep 0.1
    done
    fail "no '$1' in 60 s"
}
await '^ready$'
echo go >&3
await '^phase 1:'
# The probes, at each function's entry in its file.
while read -r _ name file offset; do
    probes+=("$name")
    echo "p:$group/$name $file:$offset" >>"$tracefs/uprobe_events"
done < <(grep '^probe ' "$log")
echo 1 >"$tracefs/events/$group/enable"
echo go >&3
await '^phase 2:'
# Each line: the file, the event (without its group), the hits.
hits=$(cat "$tracefs/uprobe_profile")
echo 0 >"$tracefs/events/$group/enable"
for p in "${probes[@]}"; do echo "-:$group/$p" >>"$tracefs/uprobe_events"; done
probes=()
echo go >&3
await '^phase 3:'
exec 3>&-
rc=0
wait "$pid" || rc=$?
cat "$log"
echo "$hits"
[ "$rc" = 0 ] || fail "the program exited $rc: an event was lost or a call failed under or after a uprobe"
for f in cuMemAlloc_v2 cuMemFree_v2 munmap; do
    n=$(awk -v e="$f" '$2 == e { print $3 }' <<<"$hits")
    [ "${n:-0}" -ge 5 ] || fail "the uprobe on $f was hit ${n:-0} times in phase 2, not once a call"
done
echo "check-uprobe: passed"
