"""Checks `memhook run --json`'s report of tests/gpu/torch_nccl.py (on
stdin, the run's whole output) for one CUDA hook mode (argv[1]); see
torch_nccl.sh. Prints one line and exits 0 when the mode saw what it
must."""
import json
import sys

mode = sys.argv[1]
lines = sys.stdin.read().splitlines()
script_ok = "torch_nccl: ok" in (l.split(" preload:")[0] for l in lines)
reports = [l for l in lines if l.startswith('{"exit_status"')]
if not reports:
    print(f"torch_nccl {mode}: no report from memhook run: FAILED")
    sys.exit(1)
j = json.loads(reports[-1])
f = j["functions"]
maps, unmaps = f.get("cuMemMap", 0), f.get("cuMemUnmap", 0)
host, freehost = f.get("cuMemHostAlloc", 0), f.get("cuMemFreeHost", 0)
if mode == "reloc":
    # GOT slots only: NCCL's driver calls go through pointers it asked
    # cuGetProcAddress for, which reloc alone does not answer.
    ok = j["exit_status"] == 0 and maps == 0
    want = "none of NCCL's cuMemMap calls"
else:
    ok = j["exit_status"] == 0 and script_ok and maps > 0 and unmaps == maps and host == freehost
    want = "every cuMemMap unmapped, every cuMemHostAlloc freed, the output CUDA"
events = json.dumps(j["events"], sort_keys=True)
print(f"torch_nccl {mode}: exit {j['exit_status']}, cuMemMap {maps}, cuMemUnmap {unmaps}, "
      f"cuMemHostAlloc {host}, cuMemFreeHost {freehost}, events {events} "
      f"(want {want}): {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
