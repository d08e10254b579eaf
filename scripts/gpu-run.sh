#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-test.sh filled:
# builds the CUDA programs with nvcc, runs every GPU test, check and
# benchmark, and writes the results to $OUT/results.txt (stdout if unset).
#   run.sh tests     the tests and checks (PASS / FAIL lines)
#   run.sh figures   the benchmarks and measured figures (430 s or more)
#   run.sh map-host  the second half of figures alone: the memtype map's
#                    benches and the host hooks' (for a call that has too
#                    little device time left for all of figures)
#   run.sh           tests and figures (about 570 s on the H200 host: close
#                    to the device tool's 600 s a call; two calls are safer)
set -uo pipefail
phase=${1:-all}
case $phase in tests | figures | map-host | all) ;; *) echo "run.sh: unknown phase '$phase' (tests, figures, map-host or all)" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
# scripts/gpu-test.sh gzips the binaries for the trip.
for z in ./*.gz; do [ -e "$z" ] && gunzip -f "$z" && chmod +x "${z%.gz}"; done
results=${OUT:-/tmp}/results.txt
: >"$results"
export MEMHOOK_FAKECUDA_SRC=$here/src
export MEMHOOK_LIB=$here/libmemhook.so
say() { echo "$*" | tee -a "$results"; }
check() { # name, command...
    local name=$1; shift
    if out=$("$@" 2>&1); then say "PASS $name"; else say "FAIL $name"; fi
    # What a test says it could not check (hugetlb memory without free
    # huge pages, say), wherever it stands in the output; then the tail.
    echo "$out" | grep -E 'not checked' | sort | uniq -c | sed -E 's/^ *([0-9]+) /    skipped (x\1): /' >>"$results"
    echo "$out" | tail -25 | sed 's/^/    /' >>"$results"
}
say "== $(nvidia-smi -L | head -2 | tr '\n' ' ')"
say "== $(nvcc --version | tail -2 | head -1)"
say "== $(lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\))' | tr -s ' ' | tr '\n' ';')"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O2 -o runtime_static src/runtime_prog.cu
"$NVCC" -O2 -cudart shared -o runtime_shared src/runtime_prog.cu
"$NVCC" -O2 --default-stream per-thread -o runtime_ptsz src/runtime_prog.cu
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(dirname "$NVCC")/../lib64

say "== kernel $(uname -r); $(ldd --version | head -1); phase $phase"

tests() {
# The host tests check hugetlb memory only where 2 MiB pages are free:
# reserve eight for them where the machine lets us, and give them back
# after (runs before 203 found none, and said so: "not checked").
huge=/proc/sys/vm/nr_hugepages
huge_before=$(cat "$huge" 2>/dev/null || echo "")
if [ -n "$huge_before" ] && echo $((huge_before + 8)) > "$huge" 2>/dev/null; then
    say "== huge pages reserved for the host tests: $(cat "$huge") (were $huge_before)"
else
    say "== huge pages: none could be reserved (the host tests skip their hugetlb checks)"
fi
for t in gpu_driver gpu_runtime gpu_multi cuda_modes cuda_memtype cuda_late_load dispatch_slots host bistro fork_loader; do
    check "$t" ./"$t" --test-threads=1 --nocapture
done
if [ -n "$huge_before" ]; then
    echo "$huge_before" > "$huge" 2>/dev/null || true
fi

# The mode matrix: what each mode sees of one run of each program (the
# program makes 5 allocations and 4 frees; at exit the runtime unloads
# its module, which frees the fifth, the global cudaGetSymbolAddress
# returned: 5 and 5). Reloc alone cannot see a static runtime
# (runtime_static, and runtime_ptsz, which nvcc also links statically):
# it reaches the driver only through cuGetProcAddress; of the shared
# runtime it sees the runtime's own calls, not the unload the runtime
# makes through the driver (5 and 4). Every other cell must see each
# event exactly once. `reloc,procaddr/reloc` is what `memhook doctor`
# advises where code pages cannot be written: the host hooks in reloc
# mode too (their symbols and the CUDA ones share reloc's table, which
# once was too small for both: every CUDA hook failed).
matrix() { # program cuda-mode[/mmap-mode] -> the JSON line (the program's own output dropped)
    local cuda=${2%/*} mmap=none
    [[ $2 == */* ]] && mmap=${2#*/}
    ./memhook run --json --cuda-mode "$cuda" --mmap-mode "$mmap" -- ./"$1" 2>/dev/null | tail -1
}
for prog in runtime_static runtime_shared runtime_ptsz; do
    for mode in reloc bistro procaddr bistro,reloc,procaddr reloc,procaddr/reloc; do
        want="5 5"
        # nvcc links the runtime statically unless told -cudart shared.
        [ "$mode" = reloc ] && want="5 4"
        [ "$mode" = reloc ] && [ "$prog" != runtime_shared ] && want="0 0"
        say "$(matrix "$prog" "$mode" | python3 -c '
import json, sys
prog, mode, want = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    j = json.loads(sys.stdin.read())
except ValueError:
    print(f"FAIL matrix {prog} {mode}: no JSON"); sys.exit()
e, f = j["events"], j["functions"]
a, b = e.get("MEM_TYPE_ALLOC", 0), e.get("MEM_TYPE_FREE", 0)
got = f"{a} {b}"
verdict = "PASS" if got == want and j["exit_status"] == 0 else "FAIL"
print(f"{verdict} matrix {prog} {mode}: alloc/free {got} (want {want}), by function {json.dumps(f, sort_keys=True)}")
' "$prog" "$mode" "$want")"
    done
done

# Under gdb (cuda-gdb where gdb is missing), breakpoints on the driver's
# cuMemAlloc_v2 and cuMemFree_v2 set before memhook installs: the
# program runs to its end, no SIGTRAP, each breakpoint hit, every event
# reported (src/under_gdb.sh; README, "Debuggers and probes").
for prog in runtime_static runtime_shared; do
    check "under gdb $prog" bash src/under_gdb.sh "$prog"
done

# Uprobes put on the driver's cuMemAlloc_v2 and cuMemFree_v2 and on
# libc's munmap once memhook's bistro hooks are in, and taken out: every
# allocation, free and unmap seen and every call successful before,
# under and after them, each probe hit once a call (src/under_uprobe.sh;
# README, "Debuggers and probes"). Not checked where tracefs cannot be
# written.
gcc -O2 -Wall -I src -o under_uprobe src/under_uprobe.c -L. -lmemhook \
    -L/usr/local/nvidia/lib64 -L"$(dirname "$NVCC")/../lib64/stubs" -lcuda -Wl,-rpath,"$here"
check "under uprobes (driver)" bash src/under_uprobe.sh ./under_uprobe

# Memory another process exported (CUDA IPC), opened in a child with
# memhook installed in each mode; "none" shows what a lookup said with
# the open unhooked (host: absent from the map), and must fail.
gcc -O2 -Wall -I src -o ipc src/ipc.c -L. -lmemhook -ldl -Wl,-rpath,"$here"
for mode in bistro procaddr bistro,reloc,procaddr; do
    check "ipc $mode" ./ipc "$mode"
done
./ipc none 2>&1 | sed 's/^/IPC-UNHOOKED /' | tee -a "$results"

# Graph memory (captured stream-ordered allocations, allocation and free
# nodes): recorded Unknown from the node's making until its free, never
# host; "none" shows what a lookup said with nothing hooked (host, while
# the graph's memory lives), and must fail.
"$NVCC" -O2 -I src -o graph src/graph.cu -L. -lmemhook -Xlinker -rpath -Xlinker "$here"
for mode in bistro procaddr bistro,reloc,procaddr; do
    check "graph $mode" ./graph "$mode"
done
./graph none 2>&1 | grep -E "launched|graph none" | head -4 | sed 's/^/GRAPH-UNHOOKED /' | tee -a "$results"

# A program's __managed__ variable (resolved by cuLibraryGetManaged):
# CUDA_MANAGED in the map; "none" shows host, and must fail.
"$NVCC" -O2 -I src -o managed src/managed.cu -L. -lmemhook -Xlinker -rpath -Xlinker "$here"
for mode in bistro procaddr bistro,reloc,procaddr; do
    check "managed $mode" ./managed "$mode"
done
./managed none 2>&1 | head -2 | sed 's/^/MANAGED-UNHOOKED /' | tee -a "$results"

# A buffer of external memory (cuImportExternalMemory of an exported
# cuMemCreate handle, cuExternalMemoryGetMappedBuffer): CUDA in the map
# until cuMemFree; "none" shows host, and must fail.
gcc -O2 -Wall -I src -I "$(dirname "$NVCC")/../include" -o external src/external.c -L. -lmemhook -ldl -Wl,-rpath,"$here"
for mode in bistro procaddr bistro,reloc,procaddr; do
    check "external $mode" ./external "$mode"
done
./external none 2>&1 | head -2 | sed 's/^/EXTERNAL-UNHOOKED /' | tee -a "$results"

# PyTorch, under memhook run, with a lookup from inside Python.
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    check torch env MEMHOOK_LIB_PATH="$here/libmemhook.so" ./memhook run -- python3 src/torch_check.py
    # cuDNN, cuBLAS and a backward pass, without and with memhook: the
    # libraries they dlopen by name are found from their callers' RUNPATH.
    # A CUDA tensor shared with a spawned process (cudaIpcOpenMemHandle).
    check "torch IPC" env MEMHOOK_LIB_PATH="$here/libmemhook.so" ./memhook run -- python3 src/torch_ipc.py
    # A CUDA graph captured by PyTorch with the cudaMallocAsync backend:
    # its output is graph memory, never host in the map; with the CUDA
    # hooks off the lookup says host, and the check must fail.
    # (Its own lines kept: memhook run's report would push them out.)
    check "torch graph (cudaMallocAsync backend)" bash -c 'set -o pipefail
        MEMHOOK_LIB_PATH="$1/libmemhook.so" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
            ./memhook run -- python3 src/torch_graph.py 2>&1 | grep "^torch_graph"' - "$here"
    env MEMHOOK_LIB_PATH="$here/libmemhook.so" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
        ./memhook run --cuda-mode none -- python3 src/torch_graph.py 2>&1 | grep -E "replay 0|torch_graph: (ok|FAILED)" |
        sed 's/^/TORCH-GRAPH-UNHOOKED /' | tee -a "$results"
    # NCCL in PyTorch's process group (one rank), in each mode:
    # src/torch_nccl.sh says what each must see of NCCL's cuMem mappings.
    for mode in bistro procaddr bistro,reloc,procaddr reloc; do
        check "torch NCCL $mode" bash src/torch_nccl.sh "$mode"
    done
    # The caching allocator with expandable segments: pages mapped into
    # one reserved range (cuMemMap) and unmapped when the cache is emptied
    # (cuMemUnmap); src/torch_expandable.py says what the map must hold.
    for mode in bistro procaddr bistro,reloc,procaddr; do
        check "torch expandable segments $mode" bash src/torch_expandable.sh "$mode"
    done
    bash src/torch_expandable.sh reloc 2>&1 | tail -1 | tee -a "$results"
    check "torch work (no memhook)" python3 src/torch_work.py
    check "torch work under memhook run" ./memhook run -- python3 src/torch_work.py
    # DataLoader workers forked from a process that used CUDA, while
    # another thread keeps the loader (and memhook's rescans) busy.
    check "torch DataLoader fork workers (no memhook)" timeout 300 python3 src/torch_fork.py
    check "torch DataLoader fork workers under memhook run" timeout 300 ./memhook run -- python3 src/torch_fork.py
    # Install time in a process that has loaded PyTorch's CUDA libraries.
    python3 src/install_in_torch.py 2>&1 | grep install_in_torch | tee -a "$results"
    j=$(./memhook run --json --mmap-mode none -- python3 -c "import torch; x = torch.empty(1 << 26, device='cuda'); torch.cuda.synchronize()" 2>/dev/null)
    say "TORCH $(echo "$j" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("exit", j["exit_status"], "events", j["events"], "functions", j["functions"], "bytes_alive", j["bytes_alive"], "threads moved", j["threads_moved"], "unchecked", j["threads_unchecked"])')"
else
    say "SKIP torch (no PyTorch with CUDA)"
fi

# Entry bytes of the teardown hooks' functions, as fixture lines
# (tests/fixtures/prologues-h200-*.tsv).
gcc -O1 -o entry_bytes src/entry_bytes.c -ldl &&
    ./entry_bytes libcuda.so.1 cuCtxDestroy_v2 cuCtxDestroy cuDevicePrimaryCtxReset_v2 cuDevicePrimaryCtxReset \
        cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxRelease \
        cuIpcOpenMemHandle_v2 cuIpcOpenMemHandle cuIpcCloseMemHandle cuMemPoolImportPointer \
        cuGraphicsResourceGetMappedPointer_v2 cuGraphicsUnmapResources cuGraphicsUnmapResources_ptsz \
        cuGraphicsUnregisterResource cuGraphicsResourceGetMappedEglFrame cuEGLStreamConsumerReleaseFrame \
        2>&1 | sed 's/^/FIXTURE /' | tee -a "$results"
./entry_bytes libc.so.6 process_madvise fallocate ftruncate truncate remap_file_pages open openat shm_open syscall creat ioctl dlopen dlclose dlsym dlvsym 2>&1 | sed 's/^/FIXTURE /' | tee -a "$results"
./memhook scan --json "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')" 2>&1 | sed 's/^/SCAN libcuda /' | tee -a "$results"
# What the driver answers about pointers of each kind (the range and
# mapping attributes classify reads): for the record, not a check.
gcc -O1 -I "$(dirname "$NVCC")/../include" -o pointer_attributes src/pointer_attributes.c \
    -L/usr/local/nvidia/lib64 -L"$(dirname "$NVCC")/../lib64/stubs" -lcuda &&
    ./pointer_attributes 2>&1 | sed 's/^/ATTRIBUTES /' | tee -a "$results"
# Which frees the driver refuses (memory of another kind), and what is
# left after each: for the record (gpu_driver checks the hooks' part).
gcc -O1 -I "$(dirname "$NVCC")/../include" -o refusals src/refusals.c \
    -L/usr/local/nvidia/lib64 -L"$(dirname "$NVCC")/../lib64/stubs" -lcuda &&
    ./refusals 2>&1 | sed 's/^/REFUSALS /' | tee -a "$results"

check "memhook demo (GPU part)" ./memhook demo
check "memhook doctor" ./memhook doctor
}

figures() {
say "== cuda_smoke (real driver)"
./cuda_smoke 2>&1 | tee -a "$results"
# The real pair and the scaling vary from process to process on one host
# (the placement of what the hooks touch): two more processes' figures.
for i in 2 3; do
    say "== cuda_smoke, process $i"
    ./cuda_smoke 2>&1 | grep -E "^cuMemAlloc_v2.*per-round|by hand.*per-round|16 threads" | tee -a "$results"
done
say "== cuda_smoke pair: nine more processes, the real pair (bare and with one handler) and the map's work by hand only"
for i in 1 2 3 4 5 6 7 8 9; do
    ./cuda_smoke pair 2>&1 | grep -E "^cuMemAlloc_v2.*per-round|by hand.*per-round" | tee -a "$results"
done
# Every process's figure so far, summed up: the goal is judged on the
# median over processes, with the spread beside it.
python3 - "$results" <<'PY' | tee -a "$results"
import re, statistics, sys
text = open(sys.argv[1]).read()
def figures(label):  # label: a regular expression for the line's start
    return [int(x) for x in re.findall("^" + label + r", median of the \d+ per-round differences: added (-?\d+) ns", text, re.M)]
pair = figures(re.escape("cuMemAlloc_v2+cuMemFree_v2 4KiB"))
handled = figures(re.escape("cuMemAlloc_v2+cuMemFree_v2 4KiB, one empty handler"))
hand = figures(re.escape("  the original + the hooks' work by hand (") + r"\d+" + re.escape(" device(s))"))
def summary(xs):
    if len(xs) < 2:
        return f"{xs}"
    q1, m, q3 = statistics.quantiles(xs, n=4)
    return f"median {m:+.0f} ns (quartiles {q1:+.0f} to {q3:+.0f}, range {min(xs):+d} to {max(xs):+d})"
print(f"real cuMemAlloc_v2+cuMemFree_v2 over {len(pair)} processes: {summary(pair)}; "
      f"at or under 50 ns in {sum(x <= 50 for x in pair)} of {len(pair)} (goal 50 ns)")
print(f"the same pair with one empty handler: {summary(handled)}; per hooked call (half a pair) "
      f"at or under 50 ns in {sum(x <= 100 for x in handled)} of {len(handled)} (SPEC.md: 50 ns per call with one handler)")
print(f"the map's work by hand after the original, same processes: {summary(hand)}")
PY
# The same pair through libmemhook.so, as `memhook run` and C embedders
# get it (a thread-local there is a call into the dynamic linker; the
# Rust examples link memhook into the executable).
gcc -O2 -Wall -I src -o pair_so src/pair_so.c -L. -lmemhook -ldl -Wl,-rpath,"$here"
say "== pair_so: the real pair through libmemhook.so, three processes"
for _ in 1 2 3; do ./pair_so 2>&1 | tee -a "$results"; done
say "== bench: fake driver, hooked vs unhooked"
./bench_cuda --bench --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "^cuMem|time:" | tee -a "$results"
say "== bench: fake driver whose calls evict the caches (cuda_cold), hooked vs unhooked"
./bench_cuda_cold 2>&1 | grep "per-round" | tee -a "$results"
}

map_host_figures() {
say "== bench: memtype map: lookups, updates, readers (65,536 ranges)"
./bench_memtype --bench "lookup_hit/|update/memhook|readers" --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "^(lookup|readers|memtype map|median)|time:|thrpt:" | tee -a "$results"
./readers 2>&1 | tee -a "$results"
say "== bench: host hooks, mmap+munmap 4 KiB (interleaved rounds, five runs)"
for _ in 1 2 3 4 5; do ./host_cost 2>&1 | tee -a "$results"; done
# The same through libmemhook.so with C handlers, as a C library that
# embeds memhook (a registration cache) gets it.
gcc -O2 -Wall -I src -o bench_host src/bench_host.c -L. -lmemhook -Wl,-rpath,"$here"
say "== bench: host hooks through libmemhook.so, C handlers (three runs)"
for _ in 1 2 3; do ./bench_host 2>&1 | tee -a "$results"; done
say "== bench: looks at the mappings, PROCMAP_QUERY against the text of /proc/self/maps"
./bench_maps --bench --warm-up-time 0.5 --measurement-time 1 2>&1 | grep -E "^median|mappings at the end" | tee -a "$results"
}

case $phase in
tests) tests ;;
figures) figures; map_host_figures ;;
map-host) map_host_figures ;;
all) tests; figures; map_host_figures ;;
esac
