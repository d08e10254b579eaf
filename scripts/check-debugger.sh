#!/usr/bin/env bash
# memhook in a program run under gdb with breakpoints on functions it
# hooks, set before memhook installs (tests/c/under_gdb.c says what is
# checked): the program must run to its end, every CUDA allocation and
# free reported through the other modes, the breakpoints hit once a call,
# and bistro's refusals must name the breakpoint. gdb is installed where
# missing; where the kernel or a sandbox refuses ptrace, says so and
# skips.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIPPED: the fake driver's entries here are x86_64's"
    exit 0
fi
command -v gdb >/dev/null || { apt-get update -qq && apt-get install -y -qq gdb; }
out=target/under-gdb
bash scripts/with-fake-driver.sh tests/c/under_gdb.c "$out"
# Unhooked by any debugger first: every bistro patch takes.
"$out/under-gdb" | tee "$out/plain.log"
if grep -q '^refused:' "$out/plain.log"; then
    echo "check-debugger: bistro refused a function with no debugger present" >&2
    exit 1
fi
# Each breakpoint counts its hits and lets the program go on.
{
    printf 'set breakpoint pending on\nset pagination off\nset confirm off\n'
    for f in cuMemAlloc_v2 munmap; do printf 'break %s\ncommands\nsilent\ncontinue\nend\n' "$f"; done
    printf 'run\ninfo breakpoints\n'
} >"$out/gdb.cmd"
log="$out/gdb.log"
timeout 300 gdb -nx -q -batch -x "$out/gdb.cmd" "$out/under-gdb" >"$log" 2>&1 || true
if grep -qiE 'ptrace: Operation not permitted|Could not trace|Couldn.t get registers|not permitted to trace' "$log"; then
    echo "SKIPPED: ptrace is refused here:"
    cat "$log"
    exit 0
fi
cat "$log"
fail() { echo "check-debugger: $*" >&2; exit 1; }
grep -q 'exited normally' "$log" || fail "the program did not run to its end under gdb"
grep -q 'SIGTRAP' "$log" && fail "a breakpoint trapped where gdb had none"
grep -q '^allocations 5, frees 5$' "$log" || fail "an allocation or free went unreported"
grep -qE '^refused: cuMemAlloc_v2: .*breakpoint at 0x[0-9a-f]+ under the patch' "$log" ||
    fail "bistro's refusal of cuMemAlloc_v2 does not name gdb's breakpoint"
grep -qE '^refused: munmap: .*breakpoint at 0x[0-9a-f]+ under the patch' "$log" ||
    fail "bistro's refusal of munmap does not name gdb's breakpoint"
# Each breakpoint hit once a call (the program's five, with munmap's from
# the loader and libc besides).
grep -qE 'breakpoint already hit 5 times' "$log" || fail "gdb's breakpoint on cuMemAlloc_v2 was not hit once a call"
echo "check-debugger: passed"
