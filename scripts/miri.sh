#!/bin/bash
# Runs memhook-core's tests under Miri, which checks every access the
# tests make for undefined behaviour: out-of-bounds and dangling reads,
# aliasing (Stacked Borrows), uninitialised bytes, and data races between
# threads, with weak memory effects emulated (an atomic load may return
# an older value, as on aarch64). The dispatcher's handshakes and the
# memtype map's lock-free reads are exercised by real threads here, at a
# tenth of the usual sizes (the tests scale down under `cfg(miri)`); the
# slowest single-threaded tests of the map's layout, which have no unsafe
# code of their own, are skipped (`cfg_attr(miri, ignore)`).
#
#   scripts/miri.sh [TOOLCHAIN]   (default nightly-2026-10-01; about 20 min on two cores)
#
# Needs a nightly toolchain with the miri and rust-src components, which
# CI's machine does not have (rustup toolchain install TOOLCHAIN
# --profile minimal --component miri,rust-src). Use a Miri of July 2026
# or later: earlier ones let a SeqCst load read a value C++20 forbids
# (rust-lang/miri#5104), which broke the dispatcher's store-buffering
# handshake in the model and failed concurrent_dispatch_never_sees_an_
# unregistered_handler with a race no real machine can make.
set -euo pipefail
toolchain=${1:-nightly-2026-10-01}
cd "$(dirname "$0")/.."
# Handler contexts are plain words (the C ABI's `void *` as `usize`), and
# the tests pass pointers through them: permissive provenance.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-permissive-provenance}"
cargo +"$toolchain" miri test -p memhook-core --lib --test dispatch --test no_alloc --test memtype_threads
