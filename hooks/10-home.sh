#!/bin/sh
# Berth standard hook: with ENROOT_MOUNT_HOME=yes, mount the caller's home
# directory inside the container and point HOME at it: at the same path, or
# at /root for a remapped root. The home is the caller's $HOME, as enroot's
# home mount takes it (`HOME=/tmp srun ...` mounts /tmp); the passwd entry's
# where HOME is unset.
set -eu

case ${ENROOT_MOUNT_HOME:-no} in  # yes/no in any case, without forking tr
    [yY] | [yY][eE][sS] | 1 | [tT][rR][uU][eE]) ;;
    *) exit 0 ;;
esac

# The caller's uid on the host, also under --root where `id -u` says 0.
host_uid=$(awk '{ print $2; exit }' /proc/self/uid_map)
home=${HOME:-}
if [ -z "$home" ]; then
    home=$(getent passwd "$host_uid" | cut -d: -f6)
fi
case $home in
    /*[[:space:]]* | /*[[:cntrl:]]*)
        echo "10-home.sh: HOME holds a space or control character; it cannot be mounted" \
            "(ENROOT_MOUNT_HOME=yes)" >&2
        exit 1 ;;
    /*) ;;
    *)
        echo "10-home.sh: HOME '$home' is not an absolute path (ENROOT_MOUNT_HOME=yes)" >&2
        exit 1 ;;
esac
if [ ! -d "$home" ]; then
    echo "10-home.sh: HOME $home is not a directory (ENROOT_MOUNT_HOME=yes)" >&2
    exit 1
fi
# A remapped root (--root, pyxis's --container-remap-root) finds it at /root,
# as with enroot; anyone else at its own path.
target=$home
if [ "${BERTH_UID:-}" = 0 ] && [ "$host_uid" != 0 ]; then
    target=/root
fi
echo "$home $target none rbind,x-create=dir" >> "$ENROOT_MOUNTS"
echo "HOME=$target" >> "$ENROOT_ENVIRON"
