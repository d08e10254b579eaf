"""Checks `memhook run --json`'s report of tests/gpu/torch_expandable.py
(on stdin, the run's whole output) for one CUDA hook mode (argv[1]); see
torch_expandable.sh. Prints one line and exits 0 when the mode saw what
it must ("reloc": prints what it saw and exits 0)."""
import json
import sys

mode = sys.argv[1]
lines = sys.stdin.read().splitlines()
script_ok = any(l.startswith("torch_expandable: ok") for l in lines)
reports = [l for l in lines if l.startswith('{"exit_status"')]
if not reports:
    print(f"torch_expandable {mode}: no report from memhook run: FAILED")
    sys.exit(1)
j = json.loads(reports[-1])
status, f = j["exit_status"], j["functions"]
maps, unmaps = f.get("cuMemMap", 0), f.get("cuMemUnmap", 0)
if mode == "reloc":
    print(f"torch_expandable reloc (not a check): exit {status}, cuMemMap {maps}, cuMemUnmap {unmaps}")
    sys.exit(0)
ok = status == 0 and script_ok and maps > 0 and unmaps == maps
events = json.dumps(j["events"], sort_keys=True)
print(f"torch_expandable {mode}: exit {status}, cuMemMap {maps}, cuMemUnmap {unmaps}, events {events} "
      f"(want the script's lookups ok and every page mapped unmapped): {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
