#!/bin/bash
# The site's NCCL network plugin (AWS OFI NCCL over libfabric, or another
# net plugin: SHARP's, the IB one) inside a container, built for the image's
# CUDA major version, as an enroot-protocol hook. Its name is the CSCS
# engine's, so that an EDF written for it works unchanged:
#   com.hooks.aws_ofi_nccl.enabled = "true"
#   com.hooks.aws_ofi_nccl.variant = "cuda12"
#
# On with BERTH_HOOK_AWS_OFI_NCCL_ENABLE: the site's default in enroot.conf
# (off unless the admin says so), over it the job's environment, over both
# the EDF's annotation. The site keeps one directory per variant under
# BERTH_NCCL_PLUGIN_DIR (enroot.conf): cuda11/, cuda12/, ... each holding
# the plugin, libnccl-net-NAME.so, with the libraries it needs that the
# image lacks, and optionally an `environment` file of KEY=VALUE lines (the
# provider's settings: FI_PROVIDER, NCCL_NET_GDR_LEVEL, ...).
#
# The variant is the annotation's (BERTH_HOOK_AWS_OFI_NCCL_VARIANT), else
# "cuda" and the major version of the image's CUDA_VERSION. Its directory
# is bound read-only at /usr/local/berth/nccl-plugin, put first on
# LD_LIBRARY_PATH, and NCCL_NET_PLUGIN=NAME makes NCCL load that plugin even
# where the image ships its own (NGC images do). The environment file's
# lines follow.
#
# Skipped, quietly: on a node without a fabric for it (no RDMA device in
# /sys/class/infiniband, no Slingshot /dev/cxi*), and for an image without
# CUDA_VERSION when no variant is named. Fails the start, in one line, when
# the site has no plugin directory, or none for the variant (naming those
# it has). Knobs, from the environment of berth start (never the
# container's): BERTH_SYS_ROOT (default /sys), BERTH_DEV_ROOT (default /dev).
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin aws_ofi_nccl BERTH_HOOK_AWS_OFI_NCCL_ENABLE

sys=${BERTH_SYS_ROOT:-/sys}
dev=${BERTH_DEV_ROOT:-/dev}
target=/usr/local/berth/nccl-plugin

has_fabric() {
    local entry
    for entry in "$sys"/class/infiniband/* "$dev"/cxi[0-9]*; do
        if [ -e "$entry" ]; then return 0; fi
    done
    return 1
}

main() {
    local variant=${BERTH_HOOK_AWS_OFI_NCCL_VARIANT:-} top dir plugin name line known
    local -a plugins=()
    has_fabric || exit 0
    container_env CUDA_VERSION
    if [ -z "$variant" ]; then
        [ -n "${CUDA_VERSION:-}" ] || exit 0
        [[ $CUDA_VERSION =~ ^([0-9]{1,3})(\.|$) ]] ||
            die "CUDA_VERSION: '${CUDA_VERSION//[^[:print:]]/?}' is not a CUDA version (name the variant: com.hooks.aws_ofi_nccl.variant)"
        variant=cuda$((10#${BASH_REMATCH[1]}))
    fi
    [[ $variant =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ ]] ||
        die "BERTH_HOOK_AWS_OFI_NCCL_VARIANT: '${variant//[^[:print:]]/?}' is not a variant name (cuda12, rocm6, ...)"
    top=${BERTH_NCCL_PLUGIN_DIR:-}
    [ -n "$top" ] || die "this site has no NCCL plugins (BERTH_NCCL_PLUGIN_DIR is not set in enroot.conf)"
    plain_path BERTH_NCCL_PLUGIN_DIR "$top"
    dir=$top/$variant
    if [ ! -d "$dir" ]; then
        known=$(cd "$top" 2>/dev/null && for name in *; do [ -d "$name" ] && printf '%s ' "$name"; done) || true
        die "no plugin for variant $variant on this node (BERTH_NCCL_PLUGIN_DIR $top has: ${known:-none})"
    fi
    for plugin in "$dir"/libnccl-net-*.so; do
        if [ -f "$plugin" ]; then plugins+=("$plugin"); fi
    done
    [ "${#plugins[@]}" = 1 ] ||
        die "$dir: expected one libnccl-net-NAME.so, found ${#plugins[@]}"
    name=${plugins[0]##*/libnccl-net-}
    name=${name%.so}
    # the environment file checked whole before anything is written
    local -a settings=("NCCL_NET_PLUGIN=$name")
    if [ -f "$dir/environment" ]; then
        while IFS= read -r line || [ -n "$line" ]; do
            [[ -z $line || $line == '#'* ]] && continue
            [[ $line =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
                die "$dir/environment: expected KEY=VALUE, got '${line//[^[:print:]]/?}'"
            settings+=("$line")
        done <"$dir/environment"
    fi
    bind "$dir" "$target" bind,ro,nosuid,nodev,x-create=dir
    line=$(library_path_line "$target")
    flush_mounts
    if [ -n "$line" ]; then settings=("$line" "${settings[@]}"); fi
    printf '%s\n' "${settings[@]}" >>"$ENROOT_ENVIRON"
}

main "$@"
