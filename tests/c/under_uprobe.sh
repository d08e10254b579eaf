#!/usr/bin/env bash
# Runs PROGRAM (tests/c/under_uprobe.c, built against a CUDA driver: the
# fake one in scripts/check-uprobe.sh, the real one on the GPU host) with
# memhook's bistro hooks only, and puts uprobes through tracefs on the
# functions it names (cuMemAlloc_v2, cuMemFree_v2, munmap, getpagesize,
# iswalpha) between its
# first and second phase, and takes them out before its third. Passes
# when the program exits 0 (every allocation, free and unmap seen and
# every call successful in each phase) and each probe was hit once a call
# while on. Where no uprobe_events file can be written here (not root, a
# container, a kernel without CONFIG_UPROBE_EVENTS), says "not checked"
# and exits 0.
#   under_uprobe.sh PROGRAM
set -euo pipefail
prog=$1
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
    echo "under_uprobe: no writable uprobe_events here (needs root and CONFIG_UPROBE_EVENTS): not checked"
    exit 0
fi
out=$(mktemp -d)
group=memhookcheck$$
log="$out/run.log"
mkfifo "$out/ctl"
probes=()
pid=
cleanup() {
    exec 3>&- 2>/dev/null || true
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    if [ -e "$tracefs/events/$group/enable" ]; then echo 0 >"$tracefs/events/$group/enable" || true; fi
    for p in "${probes[@]}"; do echo "-:$group/$p" >>"$tracefs/uprobe_events" 2>/dev/null || true; done
    if [ -n "$mounted" ]; then umount "$mounted" && rmdir "$mounted"; fi
    rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "under_uprobe: $*" >&2; cat "$log" >&2; exit 1; }
MEMHOOK_CUDA_HOOK_MODE=bistro MEMHOOK_MMAP_HOOK_MODE=bistro "$prog" <"$out/ctl" >"$log" 2>&1 &
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
pid=
cat "$log"
echo "$hits"
[ "$rc" = 0 ] || fail "the program exited $rc: an event was lost or a call failed under or after a uprobe"
for f in cuMemAlloc_v2 cuMemFree_v2 munmap getpagesize iswalpha; do
    n=$(awk -v e="$f" '$2 == e { print $3 }' <<<"$hits")
    [ "${n:-0}" -ge 5 ] || fail "the uprobe on $f was hit ${n:-0} times in phase 2, not once a call"
done
echo "under_uprobe: passed"
