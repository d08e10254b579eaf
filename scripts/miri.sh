#!/bin/bash
# Runs memhook-core's tests under Miri, which checks every access the
# tests make for undefined behaviour: out-of-bounds and dangling reads,
# uninitialised bytes, aliasing (Stacked Borrows), and data races between
# threads, with weak memory effects emulated (an atomic load may return
# an older value, as on aarch64). The dispatcher's handshakes and the
# memtype map's lock-free reads are exercised by real threads here, at
# smaller sizes (the tests scale down under `cfg(miri)`); the slowest
# single-threaded tests of the map (its layout, with no unsafe code of
# their own, and the mend after a fork, whose one unsafe call unlocks a
# spin lock) are skipped (`cfg_attr(miri, ignore)`).
#
#   scripts/miri.sh [TOOLCHAIN]   (default nightly-2026-10-01; about 6 min on two cores)
#
# Two passes. The first checks aliasing too: every test but the memtype
# map's. The second runs the map's tests without Stacked Borrows, whose
# retag of a reference to a table walks every atomic in it (thousands:
# no_alloc takes 42 s without it and was still running after ten
# minutes with it); the map takes no reference that unsafe code makes,
# so it loses nothing there, and the race and memory checks stay.
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
flags="${MIRIFLAGS:--Zmiri-permissive-provenance}"
echo "== Miri, aliasing checked: core's unit tests but the map's, and dispatch"
MIRIFLAGS="$flags" cargo +"$toolchain" miri test -p memhook-core --lib -- --skip memtype::
MIRIFLAGS="$flags" cargo +"$toolchain" miri test -p memhook-core --test dispatch
echo "== Miri, the memtype map (no Stacked Borrows): its unit tests, no_alloc, memtype_threads"
MIRIFLAGS="$flags -Zmiri-disable-stacked-borrows" cargo +"$toolchain" miri test -p memhook-core --lib -- memtype::
MIRIFLAGS="$flags -Zmiri-disable-stacked-borrows" cargo +"$toolchain" miri test -p memhook-core \
    --test no_alloc --test memtype_threads
