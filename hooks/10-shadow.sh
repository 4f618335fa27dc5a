#!/bin/sh
# Berth standard hook: make the caller's user and group known inside the
# container, so `id`, `whoami` and tools that look the user up work.
# The image's /etc/passwd and /etc/group are copied into the per-start
# runtime directory, the missing entries appended, and the copies bound
# over the originals; the image itself is never changed.
set -eu

# The container's ids come from Berth (a hook runs as the container's uid, 0 with --root).
uid=${BERTH_UID:?}
gid=${BERTH_GID:?}

for db in passwd group; do
    original="$ENROOT_ROOTFS/etc/$db"
    # A symlink could lead outside the container root: leave such images alone.
    if [ -L "$original" ] || [ ! -f "$original" ]; then
        continue
    fi
    if [ "$db" = passwd ]; then id=$uid; else id=$gid; fi
    # Copy the file and look for the id in one pass of the shell's own
    # read and printf: this hook runs in every start, and awk, cp and tail
    # were most of its time. The copy also ends in a newline.
    copy="$BERTH_RUNTIME_DIR/$db"
    found=no
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            *:*:*) third=${line#*:} third=${third#*:} third=${third%%:*}
                   [ "$third" != "$id" ] || found=yes ;;
        esac
        printf '%s\n' "$line"
    done <"$original" >"$copy"
    [ "$found" = no ] || continue
    entry=$(getent "$db" "$id" || true)
    if [ -z "$entry" ]; then
        if [ "$db" = passwd ]; then entry="user$id:x:$uid:$gid::/:/bin/sh"; else entry="group$id:x:$gid:"; fi
    elif [ "$db" = passwd ]; then
        # The host's login shell may not exist in the image.
        shell=${entry##*:}
        [ -x "$ENROOT_ROOTFS$shell" ] || entry="${entry%:*}:/bin/sh"
    fi
    echo "$entry" >> "$copy"
    echo "$copy /etc/$db none bind" >> "$ENROOT_MOUNTS"
done
