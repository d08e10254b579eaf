#!/usr/bin/env bash
# The workspace's tests under another glibc, in a Debian chroot:
#
# - bullseye (Debian 11): glibc 2.31, the C library of Ubuntu 20.04 and,
#   in what memhook meets, of RHEL 8 (2.28) and RHEL 9 (2.34): libdl,
#   libpthread and librt apart from libc (before 2.34), no
#   _dl_find_object and no list of loader namespaces (before 2.35),
#   mremap that forwards its fifth argument as the register holds it.
#   libmemhook.so built there must ask for no symbol version past
#   GLIBC_2.28, so that it loads under RHEL 8.
# - sid (Debian unstable): the newest glibc Debian has (2.43 on
#   2026-12-06) and the newest GCC (16.2 then), which builds the C
#   tests: what a new distribution brings before the GPU hosts do
#   (glibc 2.39). It moves: a kept root older than a week is made again.
# - any other suite Debian's mirror has (trixie: glibc 2.41), by name.
#
# With --docker, the tests run in a Docker container made from that root
# instead, as a GPU job in a container does: Docker's default seccomp
# profile and capabilities, its own PID and mount namespaces, no network.
# Docker (Debian's docker.io) is installed and its daemon started where
# needed (and stopped after); where it cannot be, or cannot run the
# container, the run says so and goes on in the chroot.
#
# With --remove, the suite's folder (root and build) is removed instead,
# once no mount is left under the root: those a killed run left are
# undone first, and where one stays the folder is kept (rm would go
# through a bind of the repository or the toolchain).
#
# Needs root (debootstrap, chroot, bind mounts) and, the first time,
# Debian's mirror: the root is kept in target/glibc/SUITE/root for later
# runs. Where the root cannot be made (no network, no privilege) it says
# so and exits 0, as the GPU tests skip without a GPU; a test that fails
# inside fails this script.
#
#   bash scripts/glibc.sh bullseye               # cargo test --workspace
#   bash scripts/glibc.sh sid -p memhook         # arguments go to cargo test
#   bash scripts/glibc.sh --docker sid           # in a container
#   bash scripts/glibc.sh --remove sid           # removes the root and its build
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
docker=0
remove=0
case "${1:-}" in
--docker) docker=1 && shift ;;
--remove) remove=1 && shift ;;
esac
suite="${1:?usage: glibc.sh [--docker | --remove] SUITE [cargo test arguments] (SUITE: bullseye, sid, trixie, ...)}"
shift
case "$suite" in
*[!a-z]*) echo "glibc.sh: $suite: not a Debian suite name" >&2; exit 2 ;;
esac
base="$repo/target/glibc/$suite"
root="$base/root"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"

skip() {
    echo "glibc ($suite): SKIPPED: $*"
    exit 0
}

[ "$(id -u)" = 0 ] || skip "not root (debootstrap, chroot and bind mounts need it)"

# Mounts left under the root by a run that was killed: undone first. The
# repository is bind-mounted inside, so nothing under the root is ever
# removed while any mount is there (a removal would reach the sources).
stale_mounts() {
    awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r
}
for m in $(stale_mounts); do
    umount -l "$m" || true
done
if [ -n "$(stale_mounts)" ]; then
    echo "glibc ($suite): mounts remain under $root:" $(stale_mounts) >&2
    [ "$remove" = 1 ] && echo "glibc ($suite): $base kept" && exit 0
    exit 1
fi
if [ "$remove" = 1 ]; then
    rm -rf "$base"
    exit 0
fi
# sid moves: a root made more than a week ago is made again (the stamp
# is written once debootstrap has succeeded).
if [ "$suite" = sid ] && [ -z "$(find "$base/made" -mtime -7 2>/dev/null)" ]; then
    rm -rf "$root"
fi
if [ ! -x "$root/usr/bin/gcc" ]; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq && apt-get install -y -qq debootstrap
    } || skip "debootstrap cannot be installed"
    rm -rf "$root"
    mkdir -p "$base"
    if ! debootstrap --variant=minbase --include=gcc,g++,libc6-dev,make,ca-certificates \
        "$suite" "$root" http://deb.debian.org/debian >"$base/debootstrap.log" 2>&1; then
        tail -5 "$base/debootstrap.log"
        rm -rf "$root"
        skip "debootstrap of Debian $suite failed (log: $base/debootstrap.log)"
    fi
    touch "$base/made"
fi

# Undone on any exit: the bind mounts made for the chroot, the image
# made of the root (made again each run), and a Docker daemon started
# here.
mounted=()
image=
dockerd_pid=
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[i]}" 2>/dev/null || true
    done
    if [ -n "$image" ]; then
        docker rmi -f "$image" >/dev/null 2>&1 || true
    fi
    if [ -n "$dockerd_pid" ]; then
        kill "$dockerd_pid" 2>/dev/null && wait "$dockerd_pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'cleanup; exit 1' INT TERM

# Docker's daemon, started here where none answers: 0 once `docker info`
# does (within 30 s), 1 where it cannot be installed or started (or the
# daemon exits).
start_docker() {
    if ! command -v dockerd >/dev/null; then
        { apt-get update -qq && apt-get install -y -qq docker.io >/dev/null; } || return 1
    fi
    docker info >/dev/null 2>&1 && return 0
    dockerd >"$base/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 "$dockerd_pid" 2>/dev/null || return 1 # it gave up
        sleep 0.5
    done
    return 1
}
if [ "$docker" = 1 ] && ! start_docker; then
    echo "glibc ($suite): Docker cannot be installed or started (log: $base/dockerd.log): in a chroot instead"
    docker=0
fi

echo "glibc ($suite): $(chroot "$root" ldd --version | head -1), $(chroot "$root" gcc --version | head -1)"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--workspace)
# The test binaries build C programs and libraries with the root's gcc
# and load libmemhook.so built there (an absolute target folder: the CLI
# and C ABI tests build it with `cargo build` from their own folders).
# The Rust toolchain and registry, and the repository, at their own paths.
# Line tables only, not full debug information, and no incremental
# state: the build is for running the tests (a panic's backtrace still
# names file and line), and halves the output on disk.
env=(PATH="$cargo_home/bin:/usr/bin:/bin" HOME="$HOME" CARGO_HOME="$cargo_home"
    RUSTUP_HOME="$rustup_home" CARGO_TERM_COLOR=never CARGO_TARGET_DIR="$base/target"
    CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_INCREMENTAL=0)
test_in_repo='cd "$1" && shift && cargo test "$@"'
in_chroot() {
    bind() {
        mkdir -p "$root$1"
        mount --bind "$1" "$root$1" || skip "bind mount of $1 refused"
        mounted+=("$root$1")
    }
    for d in /proc /sys /dev /dev/pts "$cargo_home" "$rustup_home" "$repo"; do
        bind "$d"
    done
    chroot "$root" /usr/bin/env -i "${env[@]}" /bin/bash -c "$test_in_repo" _ "$repo" "${args[@]}"
}
if [ "$docker" = 1 ]; then
    image="memhook-glibc:$suite"
    vols=()
    for d in "$cargo_home" "$rustup_home" "$repo"; do
        vols+=(-v "$d:$d")
    done
    envs=()
    for e in "${env[@]}"; do
        envs+=(-e "$e")
    done
    rc=0
    if tar -C "$root" -c . | docker import - "$image" >/dev/null; then
        echo "glibc ($suite): in a Docker container (default seccomp profile and capabilities, no network)"
        docker run --rm --network none "${vols[@]}" "${envs[@]}" "$image" \
            /bin/bash -c "$test_in_repo" _ "$repo" "${args[@]}" || rc=$?
    else
        rc=125
    fi
    # 125 to 127: Docker's own failure (the image, the container, its
    # start), not the tests'.
    if [ "$rc" -ge 125 ] && [ "$rc" -le 127 ]; then
        echo "glibc ($suite): Docker could not run the container (exit $rc): in a chroot instead"
        in_chroot
    elif [ "$rc" != 0 ]; then
        exit "$rc"
    fi
else
    in_chroot
fi

# What libmemhook.so built there asks of the C library: no symbol version
# past GLIBC_2.28, so that it loads under RHEL 8's glibc too (built on
# 2.31, each symbol names the oldest version that has it; glibc keeps
# every version). Weak references are left out: Rust's standard library
# names `gettid` (2.30) weakly and makes the system call where it is
# missing, and the loader does not ask for a version only weak references
# name. Built by the C ABI and CLI tests.
lib="$base/target/debug/libmemhook.so"
if [ "$suite" = bullseye ] && [ -f "$lib" ]; then
    strong() { objdump -T "$lib" | grep -vE '^[0-9a-f]+ +w '; }
    newer=$(strong | grep -oE 'GLIBC_2\.[0-9]+' | sort -uV | awk -F. '$2 > 28' | tr '\n' ' ')
    if [ -n "$newer" ]; then
        echo "glibc ($suite): libmemhook.so asks for $newer(RHEL 8 has 2.28):"
        strong | grep -E "GLIBC_2\.(29|[3-9][0-9])"
        exit 1
    fi
    echo "glibc ($suite): libmemhook.so asks for no symbol past GLIBC_2.28"
fi
