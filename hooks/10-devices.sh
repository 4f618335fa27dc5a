#!/bin/sh
# Berth standard hook: with ENROOT_RESTRICT_DEV=yes the container gets a
# minimal /dev (null, zero, full, random, urandom, tty, pts, shm); this hook
# adds the character devices the caller's device cgroup (v1) grants by
# explicit major:minor rules, e.g. the GPUs Slurm allocated under
# ConstrainDevices=yes. An "a *:*" rule or cgroup v2 (no devices.list)
# adds nothing: the minimal set stays.
set -eu

case ${ENROOT_RESTRICT_DEV:-no} in  # yes/no in any case, without forking tr
    [yY] | [yY][eE][sS] | 1 | [tT][rR][uU][eE]) ;;
    *) exit 0 ;;
esac

cgroup=$(awk -F: '$2 ~ /(^|,)devices(,|$)/ { print $3; exit }' /proc/self/cgroup)
list="/sys/fs/cgroup/devices$cgroup/devices.list"
[ -n "$cgroup" ] && [ -r "$list" ] || exit 0

for device in /dev/* /dev/*/*; do
    [ -c "$device" ] || continue
    # stat prints major and minor in hex.
    number=$(stat -c '%t %T' "$device")
    if awk -v major=$((0x${number% *})) -v minor=$((0x${number#* })) '
        $1 == "c" { split($2, n, ":")
                    if ((n[1] == "*" || n[1] == major) && (n[2] == "*" || n[2] == minor) \
                        && !(n[1] == "*" && n[2] == "*")) found = 1 }
        END { exit !found }' "$list"; then
        echo "$device $device none bind,x-create=file,nofail" >> "$ENROOT_MOUNTS"
    fi
done
