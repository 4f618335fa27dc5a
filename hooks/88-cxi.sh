#!/bin/bash
# HPE Slingshot 11 NICs inside a container, as an enroot-protocol hook: the
# node's CXI devices, and the node's libfabric (with its cxi provider) and
# libcxi in place of the image's libfabric.
#
# On with BERTH_HOOK_CXI_ENABLE: the site's default in enroot.conf (off
# unless the admin says so), over it the job's environment, over both an
# EDF's com.hooks.cxi.enable = true (the CSCS talk's spelling) or
# com.hooks.cxi.enabled = "true" (the CSCS engine's).
#
# Every /dev/cxiN of the node is bound. The node's libfabric.so.1 and
# libcxi.so.1 come from its ld.so cache; they, and what they need beyond
# the C library, are bound read-only under /usr/local/berth/cxi/lib, put
# first on LD_LIBRARY_PATH, and each is also bound over the image's own of
# that name where the image's ld.so cache lists one (a binary whose RPATH
# names the image's directory loads the node's too). Then the provider's
# settings: FI_PROVIDER=cxi, and after it the lines of the site's
# BERTH_CXI_ENVIRONMENT file (enroot.conf; FI_* KEY=VALUE lines, such as
# FI_CXI_RX_MATCH_MODE=hybrid), which may replace it.
#
# The ABI rules, checked before anything is bound (never half a
# replacement): the image's libfabric must be libfabric.so.1 (another
# soname is another ABI: named, not replaced), and no newer than the node's
# (libfabric's symbols are versioned: an application built against a newer
# one may need symbols the node's lacks); both versions are read from the
# libraries' file names (libfabric.so.1.22.0). Fails the start in one line
# for those, for a node with CXI devices but without libfabric.so.1 or
# libcxi.so.1, and for an environment file line that is no FI_* setting.
# Skipped, quietly, on a node without /dev/cxi*. Knobs, from the
# environment of berth start (never the container's): BERTH_DEV_ROOT
# (default /dev), BERTH_LDCONFIG (default ldconfig -p).
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin cxi BERTH_HOOK_CXI_ENABLE

dev=${BERTH_DEV_ROOT:-/dev}
lib_dir=/usr/local/berth/cxi/lib

# version FILE_NAME: 1.22.0 of libfabric.so.1.22.0; nothing for a bare soname.
version() {
    local name=${1##*/}
    case $name in
        *.so.*.*) echo "${name#*.so.}" ;;
    esac
}

# The image's library of cache path PATH, by its own name: its link's
# target (read, never followed: a link of the image may lead anywhere).
image_file_name() {
    local file=$ENROOT_ROOTFS$1 target
    if [ -L "$file" ]; then target=$(readlink -- "$file") && echo "${target##*/}" && return; fi
    echo "${1##*/}"
}

bind_devices() {
    local node
    for node in "$dev"/cxi[0-9]*; do
        if [ -c "$node" ]; then bind "$node" "/dev/${node##*/}" bind,nosuid,noexec,x-create=file; fi
    done
}

# provider_settings: FI_PROVIDER=cxi and the site's file's lines, checked whole.
settings=(FI_PROVIDER=cxi)
provider_settings() {
    local file=${BERTH_CXI_ENVIRONMENT:-} line
    [ -n "$file" ] || return 0
    [ -f "$file" ] || die "BERTH_CXI_ENVIRONMENT: $file: no such file on this node"
    while IFS= read -r line || [ -n "$line" ]; do
        [[ -z $line || $line == '#'* ]] && continue
        [[ $line =~ ^FI_[A-Z0-9_]*= ]] ||
            die "$file: expected an FI_* KEY=VALUE line, got '${line//[^[:print:]]/?}'"
        settings+=("$line")
    done <"$file"
}

main() {
    local entries name bits target soname path node_version theirs line
    local -A node_lib=()
    compgen -G "$dev/cxi[0-9]*" >/dev/null || exit 0
    bind_devices
    [ "${#mounts[@]}" -gt 0 ] || exit 0
    entries=$(ld_cache_entries libfabric.so libcxi.so) || exit 1
    while read -r name bits target; do
        if [ "$bits" = 64 ] && [[ $name == libfabric.so.1 || $name == libcxi.so.1 ]]; then
            node_lib[$name]=$target
        fi
    done <<<"$entries"
    for soname in libfabric.so.1 libcxi.so.1; do
        [ -n "${node_lib[$soname]:-}" ] ||
            die "this node has Slingshot devices but no $soname in its ld.so cache"
        plain_path "the node's $soname" "${node_lib[$soname]}"
    done
    node_version=$(version "${node_lib[libfabric.so.1]}")

    while read -r soname path; do
        case $soname in
            libfabric.so.1 | libcxi.so.1) ;;
            libfabric.so.[0-9]*) die "the image's libfabric is $soname, another ABI than the node's libfabric.so.1: not replaced" ;;
            *) continue ;;
        esac
        [[ $path == /* && $path != *[[:space:][:cntrl:]]* ]] ||
            die "the image's ld.so cache names '${path//[^[:print:]]/?}', not a plain absolute path"
        theirs=$(version "$(image_file_name "$path")")
        if [ "$soname" = libfabric.so.1 ] && [ -n "$theirs" ] && [ -n "$node_version" ] &&
            [ "$(printf '%s\n' "$theirs" "$node_version" | sort -V | tail -n 1)" != "$node_version" ]; then
            die "the image's libfabric $theirs is newer than the node's $node_version: not replaced"
        fi
        bind "${node_lib[$soname]}" "$path" bind,ro,nosuid,nodev
    done < <(image_libraries)

    for soname in libfabric.so.1 libcxi.so.1; do
        bind "${node_lib[$soname]}" "$lib_dir/$soname" bind,ro,nosuid,nodev,x-create=file
    done
    # what they need, but the C library's own and each other
    while read -r soname path; do
        [[ $soname =~ $glibc || $path != /* || $soname == libfabric.so.1 || $soname == libcxi.so.1 ]] && continue
        bind "$(realpath -- "$path")" "$lib_dir/$soname" bind,ro,nosuid,nodev,x-create=file
    done < <(ldd "${node_lib[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u)
    provider_settings
    line=$(library_path_line "$lib_dir")
    flush_mounts
    if [ -n "$line" ]; then settings=("$line" "${settings[@]}"); fi
    printf '%s\n' "${settings[@]}" >>"$ENROOT_ENVIRON"
}

main "$@"
