#!/usr/bin/env bash
# Builds a C program against libmemhook.so (the debug build) and the fake
# CUDA driver of tests/cuda/fakecuda.c (driver 580's entry bytes, x86_64
# code), for the checks that run one under a tool (check-debugger.sh,
# check-uprobe.sh): OUTDIR gets libcuda.so.1 and the program, named
# after SOURCE with '_' as '-'. Installs gcc where missing.
#   scripts/with-fake-driver.sh SOURCE OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
src=$1
out=$2
bash scripts/build-fake-driver.sh "$out"
cargo build -p memhook-ffi
prog=$(basename "$src" .c)
cc -O2 -Wall -Werror -I include "$src" "$out/libcuda.so.1" -L target/debug -lmemhook \
    -Wl,-rpath,"$PWD/target/debug" -Wl,-rpath,"$PWD/$out" -o "$out/${prog//_/-}"
