#!/bin/bash
# Runs one fuzz target for a while without cargo-fuzz: builds fuzz/ with
# nightly and the sanitizer-coverage flags cargo-fuzz passes (with
# --target, so that they stay off build scripts), then libFuzzer over a
# copy of the target's corpus. New inputs stay in the copy (printed at the
# end); a crash is written to the current directory and ends the run.
#
#   scripts/fuzz.sh TARGET [SECONDS]   (memtype, relocate, relocate_aarch64, elf, maps_line; default 600 s)
set -euo pipefail
target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS]}
seconds=${2:-600}
root=$(cd "$(dirname "$0")/.." && pwd)
triple=x86_64-unknown-linux-gnu
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
(cd "$root/fuzz" && RUSTFLAGS="$flags" CARGO_TARGET_DIR="$root/target/fuzz" \
    cargo +nightly build --release --bin "$target" --target "$triple")
work=$(mktemp -d)
cp -r "$root/fuzz/corpus/$target/." "$work/"
"$root/target/fuzz/$triple/release/$target" -max_total_time="$seconds" -rss_limit_mb=4096 "$work"
echo "the corpus, grown: $work"
