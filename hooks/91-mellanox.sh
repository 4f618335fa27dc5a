#!/bin/bash
# Mellanox/NVIDIA InfiniBand and RoCE HCAs inside a container, as an
# enroot-protocol hook.
#
# MELLANOX_VISIBLE_DEVICES (the container's, read from the lines of
# $ENROOT_ENVIRON): all | none | void | "" | unset (nothing) | comma
# list of indices (HCAs in name order, mlx5_2 before mlx5_10) or names
# (mlx5_0). Appends to $ENROOT_MOUNTS the selected HCAs' /dev/infiniband
# nodes (uverbsN, and umadN/issmN where present), rdma_cm, the host's verbs
# libraries and mlx4/mlx5 providers, and /etc/libibverbs.d; to
# $ENROOT_ENVIRON LD_LIBRARY_PATH.
#
# The host's verbs stack is used, not the image's: it matches the host's
# kernel driver. Its libraries go into /usr/local/rdma/lib64, put first on
# LD_LIBRARY_PATH (no write into the root, so a read-only root works).
# libibverbs looks for a provider first in the directory it was built with,
# then by plain name through the loader's path: the providers are bound into
# the same directory under their own names so that second lookup finds them.
#
# An Environment Definition File switches the hook off with the annotation
# com.hooks.mellanox.enable = false (BERTH_HOOK_MELLANOX_ENABLE=0); `no` or `false`
# there does the same.
#
# Knobs, from the environment of berth start (the caller's, never the
# container's): BERTH_LDCONFIG (command printing the ld.so
# cache, default: ldconfig -p), BERTH_SYS_ROOT (default /sys), BERTH_DEV_ROOT
# (default /dev), BERTH_ETC_ROOT (default /etc).
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin mellanox BERTH_HOOK_MELLANOX_ENABLE yes
container_env MELLANOX_VISIBLE_DEVICES

sys=${BERTH_SYS_ROOT:-/sys}
dev=${BERTH_DEV_ROOT:-/dev}
etc=${BERTH_ETC_ROOT:-/etc}
lib_dir=/usr/local/rdma/lib64
libraries=(libibverbs.so librdmacm.so libibumad.so libmlx5.so libmlx4.so libnl-3.so libnl-route-3.so)

# MELLANOX_VISIBLE_DEVICES -> selected (HCA names), checked against this
# node's HCAs (hcas, in name order).
selected=()
hcas=()
select_hcas() {
    local item
    mapfile -t hcas < <(
        for item in "$sys"/class/infiniband/*; do
            if [ -e "$item" ]; then echo "${item##*/}"; fi
        done | sort -V
    )
    if [ "$MELLANOX_VISIBLE_DEVICES" = all ]; then
        selected=("${hcas[@]}")
        return
    fi
    each_device MELLANOX_VISIBLE_DEVICES "$MELLANOX_VISIBLE_DEVICES" HCA "${#hcas[@]}" select_hca
}

select_hca() { # VARIABLE index N | VARIABLE name ITEM (each_device's handler)
    local variable=$1 hca=$3
    if [ "$2" = index ]; then
        hca=${hcas[$3]}
    elif [[ ! $hca =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]]; then
        die "$variable: '$hca' is neither an HCA index nor a name"
    elif [ ! -d "$sys/class/infiniband/$hca" ]; then
        die "$variable: no HCA $hca on this node"
    fi
    [[ " ${selected[*]} " == *" $hca "* ]] || selected+=("$hca")
}

# An HCA's character devices, named by its sysfs entries: the verbs node
# is required, the management ones bound where they exist.
bind_devices() {
    local hca entry node
    for hca in "${selected[@]}"; do
        node=''
        for entry in "$sys/class/infiniband/$hca"/device/infiniband_verbs/uverbs*; do
            [ -e "$entry" ] && node=${entry##*/}
        done
        [ -n "$node" ] || die "$sys/class/infiniband/$hca: no infiniband_verbs/uverbs* entry (ib_uverbs not loaded?)"
        [ -c "$dev/infiniband/$node" ] || die "$dev/infiniband/$node: HCA $hca's verbs device node is missing"
        bind "$dev/infiniband/$node" "/dev/infiniband/$node" bind,nosuid,noexec,x-create=file
        for entry in "$sys/class/infiniband/$hca"/device/infiniband_mad/*; do
            node=${entry##*/}
            if [ -c "$dev/infiniband/$node" ]; then
                bind "$dev/infiniband/$node" "/dev/infiniband/$node" bind,nosuid,noexec,x-create=file
            fi
        done
    done
    if [ -c "$dev/infiniband/rdma_cm" ]; then
        bind "$dev/infiniband/rdma_cm" /dev/infiniband/rdma_cm bind,nosuid,noexec,x-create=file
    fi
}

# The verbs libraries from the ld.so cache (native 64-bit entries), and the
# mlx providers beside libibverbs.
bind_libraries() {
    local entries name bits target provider
    entries=$(ld_cache_entries "${libraries[@]}") || exit 1
    while read -r name bits target; do
        [ "$bits" = 64 ] || continue
        bind "$target" "$lib_dir/$name" bind,ro,nosuid,x-create=file
        if [[ $name == libibverbs.so* ]]; then
            for provider in "${target%/*}"/libibverbs/libmlx*-rdmav*.so; do
                if [ -e "$provider" ]; then
                    bind "$(readlink -f "$provider")" "$lib_dir/${provider##*/}" bind,ro,nosuid,x-create=file
                fi
            done
        fi
    done <<<"$entries"
    if [ -d "$etc/libibverbs.d" ]; then
        bind "$etc/libibverbs.d" /etc/libibverbs.d bind,ro,nosuid,nodev,noexec,x-create=dir
    fi
}

main() {
    local line
    case ${MELLANOX_VISIBLE_DEVICES:-none} in
        none | void) exit 0 ;;
    esac
    select_hcas
    [ "${#selected[@]}" -gt 0 ] || exit 0
    bind_devices
    bind_libraries
    line=$(library_path_line "$lib_dir")
    flush_mounts
    if [ -n "$line" ]; then echo "$line" >>"$ENROOT_ENVIRON"; fi
}

main "$@"
