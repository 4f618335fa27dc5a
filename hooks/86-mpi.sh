#!/bin/bash
# The node's MPI in place of the image's, for images built with an MPICH-ABI
# MPI (MPICH, MVAPICH, Intel MPI, Cray MPICH: the libmpi.so.12 family), as an
# enroot-protocol hook: the site's tuned MPI with the fabric support the
# image's build lacks, under the image's unchanged binaries.
#
# On with BERTH_HOOK_MPI_ENABLE: the site's default in enroot.conf (off
# unless the admin says so), over it the job's environment, over both an
# EDF's com.hooks.mpi.enabled = "true". The node's MPI is
# BERTH_MPI_LIBRARY (enroot.conf): its C library, libmpi.so.12 or Debian's
# libmpich.so.12; its C++ and Fortran libraries are looked for beside it.
#
# The image's MPI libraries are read from its ld.so cache. Each of the
# MPICH-ABI family there (libmpi/libmpich.so.12, libmpicxx/libmpichcxx.so.12,
# libmpifort/libmpichfort.so.12) gets the node's counterpart bound over it,
# read-only; the libraries the node's MPI needs beyond the C library itself
# (libfabric, libucx, hwloc, ...) are bound under /usr/local/berth/mpi/lib,
# put first on LD_LIBRARY_PATH. An Open MPI library of the image is left as
# it is.
#
# Fails the start, in one line and binding nothing (never half a
# replacement), when the site names no MPI, the image's MPI is not
# MPICH-ABI (Open MPI's libmpi.so.40: named), the image has no MPI, or the
# image has a C++ or Fortran library the node's MPI lacks.
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin mpi BERTH_HOOK_MPI_ENABLE

lib_dir=/usr/local/berth/mpi/lib

main() {
    local node_c=${BERTH_MPI_LIBRARY:-} node_dir soname path kind theirs line
    local -a found=() openmpi=()
    local -A node_lib=()
    [ -n "$node_c" ] || die "this site names no MPI to put in (BERTH_MPI_LIBRARY is not set in enroot.conf)"
    plain_path BERTH_MPI_LIBRARY "$node_c"
    [ -f "$node_c" ] || die "BERTH_MPI_LIBRARY: $node_c: no such library on this node"
    node_c=$(realpath -- "$node_c")
    node_dir=${node_c%/*}
    node_lib[c]=$node_c
    for kind in cxx fort; do
        for soname in "libmpi$kind.so.12" "libmpich$kind.so.12"; do
            if [ -z "${node_lib[$kind]:-}" ] && [ -f "$node_dir/$soname" ]; then
                node_lib[$kind]=$(realpath -- "$node_dir/$soname")
            fi
        done
    done

    while read -r soname path; do
        case $soname in
            libmpi.so.12 | libmpich.so.12) found+=("c $path") ;;
            libmpicxx.so.12 | libmpichcxx.so.12) found+=("cxx $path") ;;
            libmpifort.so.12 | libmpichfort.so.12) found+=("fort $path") ;;
            libmpi.so.[0-9]*) openmpi+=("$soname") ;;
        esac
    done < <(image_libraries)
    if [[ " ${found[*]} " != *" c "* ]]; then
        [ "${#openmpi[@]}" = 0 ] ||
            die "the image's MPI is not MPICH-ABI (it has ${openmpi[0]}, Open MPI's): not replaced"
        die "the image has no MPICH-ABI MPI to replace (no libmpi.so.12 or libmpich.so.12 in its ld.so cache)"
    fi
    for line in "${found[@]}"; do
        kind=${line%% *} path=${line#* }
        theirs=${node_lib[$kind]:-}
        [ -n "$theirs" ] ||
            die "the image's ${path##*/} has no counterpart beside $node_c on this node: not replaced"
        [[ $path == /* && $path != *[[:space:][:cntrl:]]* ]] ||
            die "the image's ld.so cache names '${path//[^[:print:]]/?}', not a plain absolute path"
        bind "$theirs" "$path" bind,ro,nosuid,nodev
    done

    # What the node's libraries need, but the C library's own and the
    # MPICH-ABI family's six (the node's are bound over the image's above).
    local needed=0
    while read -r soname path; do
        [[ $soname =~ $glibc || $path != /* ]] && continue
        case $soname in
            libmpi.so.12 | libmpicxx.so.12 | libmpifort.so.12) continue ;;
            libmpich.so.12 | libmpichcxx.so.12 | libmpichfort.so.12) continue ;;
        esac
        bind "$(realpath -- "$path")" "$lib_dir/$soname" bind,ro,nosuid,nodev,x-create=file
        needed=$((needed + 1))
    done < <(for path in "${node_lib[@]}"; do ldd "$path"; done |
        awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u)
    line=''
    if [ "$needed" -gt 0 ]; then line=$(library_path_line "$lib_dir"); fi
    flush_mounts
    if [ -n "$line" ]; then echo "$line" >>"$ENROOT_ENVIRON"; fi
}

main "$@"
