#!/usr/bin/env bash
# The CUDA driver hooks' code around the driver call, as the compiler made
# it in libmemhook.so (optimised). Each property below was lost once by a
# change elsewhere that compiled and tested fine, and each costs misses in
# series from cold caches after the driver's work (measured on the H200:
# docs/measurements.md, twenty-seventh session):
#  - no hook calls a method of `Id` (a hook's own Id folds to a constant;
#    out of line, the match over every function is a call through the GOT
#    into a jump table);
#  - the driver's device frees reach the driver by a tail jump (no call
#    of it through a register), so that it returns straight to the
#    caller, and look up no thread-local (a call into the dynamic linker)
#    while no runtime hook runs (cuIpcCloseMemHandle's last close, which
#    asks the driver afterwards whether the mapping remains, is out of
#    line; the arm of a device free of marked memory, which looks at
#    the driver's answer, calls it after calling kept_freeing; the host
#    frees, cuMemFreeHost and cuMemHostUnregister, look at it always:
#    unpinning takes microseconds);
#  - cuMemAlloc_v2's hook looks up no thread-local before the driver call.
# Fails naming the function and the property. x86_64 instruction names.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3; }
command -v objdump >/dev/null || { apt-get update -qq && apt-get install -y -qq binutils; }
cargo build --release -p memhook-ffi
so=target/release/libmemhook.so
# Calls through the GOT name the slot, not the function: the slots'
# relocations and the symbols resolve them.
objdump -R "$so" >target/check-hook-code.relocs
nm -C --defined-only "$so" >target/check-hook-code.syms
objdump -d --no-show-raw-insn -C "$so" | python3 -c '
import re, sys
symbols = {}
for line in open("target/check-hook-code.syms"):
    parts = line.rstrip("\n").split(" ", 2)
    if len(parts) == 3:
        symbols[int(parts[0], 16)] = parts[2]
slots = {}
for line in open("target/check-hook-code.relocs"):
    m = re.match(r"([0-9a-f]+)\s+R_X86_64_(RELATIVE\s+\*ABS\*\+0x([0-9a-f]+)|(GLOB_DAT|JUMP_SLOT)\s+(\S+))", line)
    if m:
        slots[int(m.group(1), 16)] = symbols.get(int(m.group(3), 16), "?") if m.group(3) else m.group(5)
def callee(line):  # what a call or jump reaches, by name where known
    m = re.search(r"\*0x[0-9a-f]+\(%rip\)\s+# ([0-9a-f]+)", line)
    return slots.get(int(m.group(1), 16), "") if m else line
hooks = {}
name = None
for line in sys.stdin:
    m = re.match(r"[0-9a-f]+ <memhook::cuda::hooks::(cu[A-Za-z0-9_]+|cuda[A-Za-z0-9_]+)>:", line)
    if m:
        name = m.group(1)
        hooks[name] = []
    elif not line.strip():
        name = None
    elif name:
        hooks[name].append(line)
bad = []
def need(cond, what):
    if not cond:
        bad.append(what)
need(len(hooks) > 40, f"only {len(hooks)} hooks found: are the symbol names stale?")
for h, body in hooks.items():
    need(not any("hooks::Id::" in callee(l) for l in body if re.search(r"\s(call|jmp)\s", l)), f"{h}: calls a method of Id")
reg_call = re.compile(r"\scall\s+\*%r")
reg_jump = re.compile(r"\sjmp\s+\*%r")
for h in ("cuMemFree_v2", "cuMemFree", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuIpcCloseMemHandle"):
    body = hooks.get(h, [])
    need(body, f"{h}: not found")
    # The one call allowed: of the driver, in the arm of marked memory,
    # which looks at its answer (right after kept_freeing).
    need(
        all(any("kept_freeing" in p for p in body[max(0, i - 6):i]) for i, l in enumerate(body) if reg_call.search(l)),
        f"{h}: calls the driver through a register (no tail call)",
    )
    need(any(reg_jump.search(l) for l in body), f"{h}: no tail jump to the driver")
    need(not any("__tls_get_addr" in l for l in body), f"{h}: looks up a thread-local itself")
body = hooks.get("cuMemAlloc_v2", [])
first_call = next((i for i, l in enumerate(body) if reg_call.search(l)), None)
need(first_call is not None, "cuMemAlloc_v2: no call of the driver found")
if first_call is not None:
    need(not any("__tls_get_addr" in l for l in body[:first_call]), "cuMemAlloc_v2: looks up a thread-local before the driver call")
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"CUDA hooks code: {len(hooks)} hooks, no Id call; the driver frees tail-jump to the driver; no thread-local lookup before the driver on the hot paths")
'
