#!/usr/bin/env bash
# Runs on the device machine (or here), from the folder scripts/gpu-ab.sh
# filled: rounds of the old and the new build's programs in turn, the
# order alternating from round to round, until SECONDS have passed; then
# the round-by-round comparison (compare.py). The log goes to $OUT/ab.log
# ($OUT unset: a temporary folder), the comparison to $OUT/ab-summary.txt
# and stdout.
#   run.sh [SECONDS]    (default 420)
set -uo pipefail
ab=$(cd "$(dirname "$0")" && pwd)
limit=${1:-420}
out=${OUT:-$(mktemp -d)}
log=$out/ab.log
cd "$(mktemp -d)"
families=$(cat "$ab/families")
for b in old new; do
    for f in $families; do
        case $f in
            pair) gcc -O2 -Wall -I "$ab/src" -o "pair_so_$b" "$ab/src/pair_so.c" -L"$ab/$b" -lmemhook -ldl -Wl,-rpath,"$ab/$b" ;;
            host) gcc -O2 -Wall -I "$ab/src" -o "bench_host_$b" "$ab/src/bench_host.c" -L"$ab/$b" -lmemhook -Wl,-rpath,"$ab/$b" ;;
        esac
    done
done
{
    echo "# $(uname -r); $(lscpu | grep -E '^Model name' | tr -s ' ')"
    echo "# $(nvidia-smi -L 2>/dev/null | head -1)"
    sed 's/^/# /' "$ab/versions"
} >"$log"
start=$SECONDS
r=0
while [ $((SECONDS - start)) -lt "$limit" ]; do
    r=$((r + 1))
    if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for b in $order; do
        echo "== $b round $r" >>"$log"
        for f in $families; do
            case $f in
                pair)
                    "$ab/$b/cuda_smoke" pair 2>&1 | grep per-round
                    "./pair_so_$b" 2>&1 | grep -v '^#'
                    ;;
                host)
                    "$ab/$b/host_cost" 2>&1
                    "./bench_host_$b" 2>&1
                    ;;
                cold)
                    # The fake driver, built from the carried sources.
                    MEMHOOK_FAKECUDA_SRC="$ab/src/cuda" "$ab/$b/bench_cuda_cold" 2>&1 | grep per-round
                    ;;
                memtype)
                    "$ab/$b/readers" 2>&1
                    # From a folder of each build's own, so that criterion
                    # compares each with its own last run, not the other's.
                    (mkdir -p "crit_$b" && cd "crit_$b" && "$ab/$b/bench_memtype" --bench 'lookup_hit/memhook' \
                        --warm-up-time 1 --measurement-time 2 2>&1 | grep -E '^lookup_hit|time:')
                    ;;
            esac
        done >>"$log"
    done
done
python3 "$ab/compare.py" "$log" | tee "$out/ab-summary.txt"
