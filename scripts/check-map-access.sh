#!/usr/bin/env bash
# The CUDA hooks update the process's memtype map right after a driver
# call, from cold caches, so they must address it directly (rip-relative).
# A static that a function inlinable across crates names is exported from
# the rlib, and every access to it then loads its address from the GOT
# first: one more dependent load, a miss after the driver's work. rustc
# makes small call-free public functions inlinable across crates by itself,
# so this breaks easily (it did once). Fails when any access to the map in
# the optimised build goes through the GOT. x86_64 relocation names.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3; }
command -v objdump >/dev/null || { apt-get update -qq && apt-get install -y -qq binutils; }
# The rlib of `memhook` this build links (older ones may lie beside it).
rlibs=$(cargo build --release -p memhook-ffi --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "memhook":
        print("\n".join(f for f in m["filenames"] if f.endswith(".rlib")))')
[ -n "$rlibs" ] || { echo "no rlib of memhook built" >&2; exit 1; }
map='_ZN7memhook7memtype3MAP17h'
direct=0
for rlib in $rlibs; do
    dir=$(mktemp -d)
    (cd "$dir" && ar x "$rlib")
    relocs=$(objdump -dr "$dir"/*.o | grep -E "R_X86_64_[A-Z0-9_]+[[:space:]]+$map" || true)
    rm -rf "$dir"
    if grep -qE "GOTPCREL" <<<"$relocs"; then
        echo "$rlib: the memtype map is reached through the GOT:" >&2
        grep -E "GOTPCREL" <<<"$relocs" | sort | uniq -c >&2
        exit 1
    fi
    direct=$((direct + $(grep -cE "R_X86_64_PC32" <<<"$relocs" || true)))
done
[ "$direct" -gt 0 ] || { echo "no direct access to $map found: is the symbol's name stale?" >&2; exit 1; }
echo "memtype map: $direct direct (rip-relative) accesses, none through the GOT"
