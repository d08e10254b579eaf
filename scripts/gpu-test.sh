#!/usr/bin/env bash
# Builds here everything the GPU validation needs into dist/gpu (ignored),
# for the device machine (which has no Rust toolchain):
#   scripts/gpu-test.sh
# then, through the device tool, with carry ["dist/gpu"]:
#   bash dist/gpu/run.sh tests      (writes $OUT/results.txt)
#   bash dist/gpu/run.sh figures    (a second call: the two together take
#                                    about 570 of the 600 s a call may run)
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist/gpu
rm -rf "$out" && mkdir -p "$out/src"
cargo build --release -p memhook-ffi -p memhook-cli
cargo build --release -p memhook --example cuda_smoke --example host_cost
cargo build --release -p memhook-core --example readers
cargo bench -p memhook-tests --bench cuda --no-run 2>/dev/null
cargo bench -p memhook-tests --bench cuda_cold --no-run 2>/dev/null
cargo bench -p memhook-core --bench memtype --no-run 2>/dev/null
cargo bench -p memhook --bench maps --no-run 2>/dev/null
exes=$(cargo test --release -p memhook-tests --test gpu_driver --test gpu_runtime --test gpu_multi --test cuda_modes --test cuda_memtype \
    --test cuda_late_load --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
while read -r name exe; do cp "$exe" "$out/$name"; done <<<"$exes"
# The dispatch stress and slot tests, on the device's 16 cores; the host
# hooks' tests on its kernel and glibc (2.39, with CET entries); bistro's,
# with the threads held out of the bytes being patched, on 16 cores; forks
# beside the loader's own work (its lock over the objects, 2.39's offset).
for t in dispatch_slots host bistro fork_loader; do
    exe=$(cargo test --release -p memhook --features bistro --test "$t" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    cp "$exe" "$out/$t"
done
cp target/release/libmemhook.so target/release/memhook target/release/examples/cuda_smoke target/release/examples/host_cost \
    target/release/examples/readers "$out/"
cp "$(ls -t target/release/deps/cuda-* | grep -v '\.d$' | head -1)" "$out/bench_cuda"
cp "$(ls -t target/release/deps/cuda_cold-* | grep -v '\.d$' | head -1)" "$out/bench_cuda_cold"
cp "$(ls -t target/release/deps/memtype-* | grep -v '\.d$' | head -1)" "$out/bench_memtype"
cp "$(ls -t target/release/deps/maps-* | grep -v '\.d$' | head -1)" "$out/bench_maps"
strip "$out"/* 2>/dev/null || true
# The carried folder must stay well under the device tool's 64 MiB: the
# binaries travel gzipped, and run.sh unpacks them.
gzip -9 "$out"/* 2>/dev/null || true
cp tests/cuda/*.c tests/gpu/* tests/c/bench_host.c tests/c/under_uprobe.c tests/c/under_uprobe.sh include/memhook.h "$out/src/"
cp scripts/gpu-run.sh "$out/run.sh"
du -sh "$out"
