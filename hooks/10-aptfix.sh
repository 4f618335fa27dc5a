#!/bin/sh
# Berth standard hook: under a remapped root (--root) apt cannot switch to
# its sandbox user `_apt` (only one uid is mapped), so `apt-get update`
# fails. Tell apt to stay root, for Debian/Ubuntu images only.
set -eu

[ "${BERTH_UID:?}" = 0 ] || exit 0
[ -d "$ENROOT_ROOTFS/etc/apt/apt.conf.d" ] || exit 0
[ ! -L "$ENROOT_ROOTFS/etc/apt" ] || exit 0

conf="$BERTH_RUNTIME_DIR/apt-sandbox.conf"
echo 'APT::Sandbox::User "root";' > "$conf"
echo "$conf /etc/apt/apt.conf.d/00berth-sandbox none bind,ro,x-create=file,nofail" >> "$ENROOT_MOUNTS"
