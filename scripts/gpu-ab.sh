#!/usr/bin/env bash
# Builds an A/B of two versions of memhook for the device machine (or this
# one): BASE (a commit) as "old", the working tree as "new", into dist/ab
# (ignored), with the runner that alternates them there and compares them
# round by round (scripts/ab-compare.py).
#
#   scripts/gpu-ab.sh BASE [FAMILY...]
#
# Families (default: pair):
#   pair     the real cuMemAlloc_v2+cuMemFree_v2, bare and with one handler
#            (`cuda_smoke pair`, memhook linked in) and through
#            libmemhook.so (tests/gpu/pair_so.c): needs the GPU;
#   host     mmap+munmap with the host hooks (`host_cost`, and
#            tests/c/bench_host.c through libmemhook.so);
#   memtype  the map's lookups (the `memtype` bench's lookup_hit/memhook
#            and the `readers` example);
#   cold     the fake driver's cuMemAlloc_v2+cuMemFree_v2 after work that
#            evicts the caches, bare and with one handler (the `cuda_cold`
#            bench, memhook linked in; the fake built with gcc there).
#
# Then, through the device tool, with carry ["dist/ab"]:
#   bash dist/ab/run.sh [SECONDS]   (default 420: rounds until then)
# which writes $OUT/ab.log and prints the comparison. A pair round takes
# about 45 s on the H100 and H200 hosts, a host round 10 s, a memtype
# round 30 s, a cold round 7 s on the dev VM. The host, memtype and cold
# families run here too (bash dist/ab/run.sh 120), for a first look on
# the dev VM.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
base=$(git rev-parse --verify "$1^{commit}")
shift
families=${*:-pair}
for f in $families; do
    case $f in pair | host | memtype | cold) ;; *) echo "gpu-ab.sh: unknown family '$f' (pair, host, memtype or cold)" >&2; exit 2 ;; esac
done
out=dist/ab
rm -rf "$out" && mkdir -p "$out/old" "$out/new" "$out/src"

# The executable of a cargo target, by the JSON messages of a build.
executable() {
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}

# build SOURCE_DIR TARGET_DIR DEST: the families' binaries of one version.
build() {
    local src=$1 target=$2 dest=$3
    (
        cd "$src"
        export CARGO_TARGET_DIR=$target
        cargo build --release -q -p memhook-ffi
        cp "$target/release/libmemhook.so" "$dest/"
        for f in $families; do
            case $f in
                pair) cp "$(cargo build --release -q -p memhook --example cuda_smoke --message-format=json | executable)" "$dest/" ;;
                host) cp "$(cargo build --release -q -p memhook --example host_cost --message-format=json | executable)" "$dest/" ;;
                memtype)
                    cp "$(cargo build --release -q -p memhook-core --example readers --message-format=json | executable)" "$dest/"
                    cp "$(cargo bench -q -p memhook-core --bench memtype --no-run --message-format=json 2>/dev/null | executable)" \
                        "$dest/bench_memtype"
                    ;;
                cold)
                    cp "$(cargo bench -q -p memhook-tests --bench cuda_cold --no-run --message-format=json 2>/dev/null | executable)" \
                        "$dest/bench_cuda_cold"
                    ;;
            esac
        done
    )
    strip "$dest"/* 2>/dev/null || true
}

tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
git worktree add -q --detach "$tree" "$base"
echo "gpu-ab.sh: old = $(git log --oneline -1 "$base")"
build "$tree" "$PWD/target/ab-base" "$PWD/$out/old"
echo "gpu-ab.sh: new = the working tree ($(git describe --always --dirty))"
build "$PWD" "$PWD/target" "$PWD/$out/new"
cp tests/gpu/pair_so.c tests/gpu/events.h tests/c/bench_host.c include/memhook.h "$out/src/"
mkdir -p "$out/src/cuda" && cp tests/cuda/*.c "$out/src/cuda/"
cp scripts/gpu-ab-run.sh "$out/run.sh"
cp scripts/ab-compare.py "$out/compare.py"
echo "$families" >"$out/families"
git log --oneline -1 "$base" >"$out/versions"
echo "working tree of $(git describe --always --dirty)" >>"$out/versions"
du -sh "$out"
