#!/bin/bash
# Runs the workspace's test binaries, built by root, as a user other than
# root (nobody by default): what most users are. A test that behaves
# differently without root's rights (userfaultfd, hugetlb pages, a
# program of another user, /proc) meets those rights here, which CI's
# root never does. Each binary runs from its package's folder, as cargo
# runs it; libmemhook.so is built first (the tests that load it would
# build it with cargo, which another user cannot run here).
# `header_is_current` is left out: it runs cargo metadata, and says
# nothing about rights.
#
#   scripts/tests-as-user.sh [USER]
set -euo pipefail
user=${1:-nobody}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# What the tests' own `libmemhook()` would build (the command binary
# comes with the test build below).
cargo build -p memhook-ffi
cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"], m["manifest_path"])
' > target/tests-as-user.list
# The user must reach the checkout (a clone in root's home is out of
# its reach): a skip that says why, not a failure of every test.
first=$(head -1 target/tests-as-user.list | cut -d' ' -f1)
as_user=(setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups)
if ! "${as_user[@]}" test -x "$first" -a -r "$root/Cargo.toml"; then
    echo "SKIPPED: $user cannot reach $root (a folder on the way is closed to it)"
    exit 0
fi
home=$(mktemp -d)
chmod 777 "$home"
failed=0
while read -r exe manifest; do
    dir=$(dirname "$manifest")
    name=$(basename "$exe")
    skip=()
    [[ $name == header-* ]] && skip=(--skip header_is_current)
    if (cd "$dir" && timeout 900 "${as_user[@]}" \
        env HOME="$home" TMPDIR="$home" CARGO_MANIFEST_DIR="$dir" MEMHOOK_TEST_LIB_BUILT=1 \
        "$exe" "${skip[@]}" > "$home/$name.log" 2>&1); then
        echo "ok   $name: $(grep '^test result' "$home/$name.log" | tail -1)"
    else
        echo "FAIL $name (as $user):"
        # Each panic with the lines of its message after it.
        grep -E -A4 '^test .*FAILED|panicked|^failures:' "$home/$name.log" | head -40 || tail -20 "$home/$name.log"
        failed=1
    fi
done < target/tests-as-user.list
rm -rf "$home"
exit $failed
