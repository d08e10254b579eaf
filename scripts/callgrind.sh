#!/usr/bin/env bash
# Instructions a hooked call adds, as a C user of libmemhook.so pays them,
# counted by callgrind: the machine's load does not move these figures, so
# they show what a change of the hook paths does where the timings' spread
# would hide it. For each family (mmap+munmap of 4 KiB; the fake driver's
# cuMemAlloc_v2 + cuMemFree_v2 of 4 KiB, the same address each time, and
# of 256 bytes among eight live, a new address each time) and each setting (unhooked;
# hooked, no handler; one empty C handler of the family's aggregate
# events), tests/c/instr.c makes N and then 2N pairs under callgrind; the
# difference over N is the pair's count, free of start-up and install.
#
#   bash scripts/callgrind.sh [N]        (N defaults to 10000; about a minute)
#
# Needs valgrind (Debian's package) and cc. --smc-check=all: without it
# valgrind keeps running code it translated before a patch changed it.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 2; }
cargo build --release -q -p memhook-ffi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash scripts/build-fake-driver.sh "$out"
cc -O2 -Wall -I include tests/c/instr.c "$out/libcuda.so.1" -L target/release -lmemhook \
    -Wl,-rpath,"$PWD/target/release" -Wl,-rpath,"$out" -o "$out/instr"

# Instructions of one run of `instr FAMILY SETTING PAIRS`.
count() {
    local log
    # The fake driver reserves 1 TiB of address space by default, which
    # valgrind refuses: 4 GiB is room enough here.
    if ! log=$(FAKECUDA_ARENA_GIB=4 valgrind --tool=callgrind --smc-check=all \
        --callgrind-out-file=/dev/null "$out/instr" "$@" 2>&1); then
        echo "callgrind.sh: instr $* failed:" >&2
        echo "$log" >&2
        exit 1
    fi
    echo "$log" | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

echo "instructions a pair (callgrind, the difference of $n and $((2 * n)) pairs):"
for family in mmap cuda ring; do
    base=
    for setting in plain hooked handler; do
        one=$(count "$family" "$setting" "$n")
        two=$(count "$family" "$setting" $((2 * n)))
        per=$(((two - one) / n))
        if [ -z "$base" ]; then
            base=$per
            printf '  %-4s %-8s %6d\n' "$family" "$setting" "$per"
        else
            printf '  %-4s %-8s %6d  (%+d)\n' "$family" "$setting" "$per" $((per - base))
        fi
    done
done
