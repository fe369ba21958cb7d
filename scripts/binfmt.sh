#!/usr/bin/env bash
# Let this amd64 machine run linux/arm64 binaries (mmdebstrap's second stage, arm64 image builds and
# containers) through QEMU user emulation registered with binfmt_misc; idempotent, called by setup.sh
# after qemu-user-static and binfmt-support are installed.
#   1. /proc/sys/fs/binfmt_misc mounted (mount -t binfmt_misc), only if it is not a mountpoint
#   2. the qemu-aarch64 entry enabled (update-binfmts --enable qemu-aarch64), only if it is not
#   3. the entry checked as buildtool.contracts.platforms.binfmt_problem checks it: present, enabled,
#      flag F (the interpreter opened at registration, so containers without it can use it); else a
#      one-line error naming the fix, exit 2
# Every step says whether it did something or found it done. BINFMT_MISC names another folder (tests).
set -euo pipefail

DIR="${BINFMT_MISC:-/proc/sys/fs/binfmt_misc}"
ENTRY=qemu-aarch64

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 2; }
# shellcheck source=scripts/as-root.sh
source "$(dirname "${BASH_SOURCE[0]}")/as-root.sh"   # can_root, as_root

if [[ "$(uname -m)" == aarch64 ]]; then
  say "arm64 host: linux/arm64 runs natively, no QEMU entry needed"
  exit 0
fi

# -- 1. binfmt_misc mounted -------------------------------------------------------------------
if mountpoint -q "$DIR"; then
  say "binfmt_misc already mounted ($DIR)"
else
  can_root || die "$DIR is not mounted; run this script as root or with passwordless sudo (it mounts binfmt_misc)"
  say "mounting binfmt_misc on $DIR"
  as_root mount -t binfmt_misc binfmt_misc "$DIR" \
    || die "mount -t binfmt_misc binfmt_misc $DIR failed; in a container, run scripts/setup.sh on the host"
fi

# -- 2. qemu-aarch64 enabled ------------------------------------------------------------------
if [[ -f "$DIR/$ENTRY" && "$(head -n1 "$DIR/$ENTRY")" == enabled ]]; then
  say "binfmt_misc entry $ENTRY already enabled"
else
  can_root \
    || die "binfmt_misc entry $ENTRY is missing or disabled; run this script as root or with passwordless sudo"
  say "enabling binfmt_misc entry $ENTRY (update-binfmts --enable $ENTRY)"
  as_root update-binfmts --enable "$ENTRY" >&2 || true   # its own message says why; the check below names the fix
fi

# -- 3. what the toolkit needs of it (platforms.binfmt_problem) ---------------------------------
[[ -f "$DIR/$ENTRY" ]] \
  || die "binfmt_misc has no $ENTRY entry after update-binfmts; reinstall qemu-user-static (apt-get install --reinstall qemu-user-static binfmt-support)"
[[ "$(head -n1 "$DIR/$ENTRY")" == enabled ]] \
  || die "binfmt_misc entry $ENTRY is disabled; run \`update-binfmts --enable $ENTRY\` as root"
flags="$(sed -n 's/^flags: *//p' "$DIR/$ENTRY")"
[[ "$flags" == *F* ]] \
  || die "binfmt_misc entry $ENTRY lacks flag F (has '${flags:-none}'), so containers cannot open its interpreter; reinstall qemu-user-static (Debian's registers it with F)"
say "binfmt_misc entry $ENTRY enabled with flags $flags: linux/arm64 runs under QEMU"
