#!/usr/bin/env bash
# Builds the fake CUDA driver of tests/cuda/fakecuda.c (driver 580's
# entry bytes, x86_64 code) as OUTDIR/libcuda.so.1, for the scripts that
# run a C program over it (check-stack.sh, callgrind.sh and, for
# check-debugger.sh and check-uprobe.sh, with-fake-driver.sh). Installs
# gcc where missing. OUTDIR: relative to the repository's root, or
# absolute.
#   scripts/build-fake-driver.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc; }
mkdir -p "$1"
cc -shared -fPIC -O2 -Wall -Werror -Wl,-soname,libcuda.so.1 -o "$1/libcuda.so.1" tests/cuda/fakecuda.c -lpthread
