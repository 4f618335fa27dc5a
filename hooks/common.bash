# Shared by Berth's bash hooks (80-slurm.sh, 85-aws_ofi_nccl.sh, 86-mpi.sh,
# 87-ssh.sh, 88-cxi.sh, 90-nvidia.sh, 91-mellanox.sh), which source it. Not a hook itself: without
# the .sh suffix the runtime does not run it.
#
# A hook finds it beside its own real file (a hook linked into hooks.d too;
# readlink forks only then: every hook runs in every container start), and
# begins with hook_begin:
#   here=${BASH_SOURCE[0]%/*}
#   if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
#   . "$here/common.bash"
#   hook_begin NAME [SWITCH]
# It collects its fstab lines with bind and writes them with flush_mounts
# once every check passed, so a refused start leaves $ENROOT_MOUNTS as it was.

# Host programs (ldconfig, nvidia-smi) live in sbin dirs an ordinary user's PATH may lack.
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() {
    echo "$hook_name hook: $*" >&2
    exit 1
}

# hook_begin NAME [SWITCH [DEFAULT]]: NAME names the hook in its messages;
# with SWITCH, the hook's on/off variable (see switch_on; DEFAULT where it
# is unset, else off), the hook ends here, doing nothing, unless it is on.
hook_begin() {
    hook_name=$1
    if [ -n "${2:-}" ]; then switch_on "$2" "${3:-no}" || exit 0; fi
}

# container_env NAME... : the container's values of NAME (a name ending in
# '*' stands for every name with that prefix), read as data from the
# KEY=VALUE lines of $ENROOT_ENVIRON (the container's environment, then the
# lines earlier hooks appended; the last one wins) into shell variables of
# this hook, not exported. The hook's own environment is the caller's: the
# image's variables never reach it, and a variable of the caller with such a
# name is dropped first, so the container's view alone counts.
container_env() {
    local name line key matched
    local -A wanted=()
    local -a prefixes=()
    for name; do
        if [[ $name == *'*' ]]; then
            prefixes+=("${name%'*'}")
            for key in $(compgen -v "${name%'*'}" || true); do unset "$key"; done
        else
            wanted[$name]=1
            unset "$name"
        fi
    done
    [ -f "${ENROOT_ENVIRON:?}" ] || return 0
    while IFS= read -r line || [ -n "$line" ]; do
        key=${line%%=*}
        [[ $line == *=* && $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
        if [ -z "${wanted[$key]:-}" ]; then
            matched=''
            for name in ${prefixes[@]+"${prefixes[@]}"}; do
                if [[ $key == "$name"* ]]; then matched=1; break; fi
            done
            [ -n "$matched" ] || continue
        fi
        printf -v "$key" '%s' "${line#*=}"
    done <"$ENROOT_ENVIRON"
}

# switch_on NAME DEFAULT: whether the on/off variable NAME (the hook's own,
# from enroot.conf, the caller's environment or an EDF annotation) is on;
# DEFAULT where it is unset or empty. yes/no, true/false, y/n, 1/0, in any
# case; anything else fails the start naming the variable.
switch_on() {
    local value=${!1:-$2}
    case ${value,,} in
        1 | y | yes | true) return 0 ;;
        0 | n | no | false) return 1 ;;
        *) die "$1: expected yes or no, got '${value//[^[:print:]]/?}'" ;;
    esac
}

# each_device VARIABLE LIST WHAT COUNT HANDLER: the items of the comma
# list LIST (VARIABLE's value, a *_VISIBLE_DEVICES one; blanks dropped),
# each in turn to HANDLER as "VARIABLE index N" for an index, checked
# against the node's COUNT devices of kind WHAT (GPU, HCA), or as
# "VARIABLE name ITEM" for anything else, which HANDLER checks itself.
each_device() {
    local variable=$1 list=$2 what=$3 count=$4 handler=$5 item
    local -a items
    IFS=, read -ra items <<<"$list"
    for item in "${items[@]}"; do
        item=${item//[[:space:]]/}
        if [[ $item =~ ^[0-9]+$ ]]; then
            { [ "${#item}" -lt 6 ] && [ "$((10#$item))" -lt "$count" ]; } ||
                die "$variable: no $what $item on this node (it has $count)"
            "$handler" "$variable" index "$((10#$item))"
        else
            "$handler" "$variable" name "$item"
        fi
    done
}

# plain_path WHAT PATH: PATH goes into an fstab line, so it must be absolute,
# without spaces or control characters; else the start fails naming WHAT.
plain_path() {
    [[ $2 == /* && $2 != *[[:space:][:cntrl:]]* ]] ||
        die "$1: '${2//[^[:print:]]/?}' is not an absolute path without spaces"
}

# inside DIR WANTED: DIR, a path in the container's root, must lead to a
# place inside it: an image's link on the way (/usr/local to /somewhere)
# could lead out. WANTED is the path named in the message.
inside() {
    local real top_real
    { real=$(realpath -- "$1") && top_real=$(realpath -- "$ENROOT_ROOTFS") &&
        [[ $real == "$top_real" || $real == "$top_real/"* ]]; } ||
        die "${2#"$ENROOT_ROOTFS"}: a link of the image leads it out of the container's root"
}

# make_in_root DIR: make DIR (a path in the container's root, absolute and
# plain) and what leads to it, after checking that no image link on the
# way leads out of the root. For files a hook writes into the root itself
# (its tmpfs upper for an image): the runtime directory may be mounted
# noexec, which a bind keeps in a user namespace.
make_in_root() {
    local dir=$1
    plain_path ENROOT_ROOTFS "$ENROOT_ROOTFS"
    until [ -e "$dir" ]; do dir=${dir%/*}; done
    inside "$dir" "$1"  # before anything is made on the way
    mkdir -p "$1"
}

mounts=()
declare -A bound=()
bind() { # SRC DST OPTIONS; each destination once
    [ -z "${bound[$2]:-}" ] || return 0
    bound[$2]=1
    mounts+=("$1 $2 none $3")
}

flush_mounts() {
    if [ "${#mounts[@]}" -gt 0 ]; then
        printf '%s\n' "${mounts[@]}" >>"${ENROOT_MOUNTS:?}"
    fi
}

# ld_cache_entries BASE...: "NAME BITS FILE" for every ld.so cache entry
# called BASE or BASE.<version> (BITS 64 or 32; FILE the entry resolved),
# from $BERTH_LDCONFIG (default: ldconfig -p). Run it in $(...) || exit 1.
ld_cache_entries() {
    local ldconfig=${BERTH_LDCONFIG:-ldconfig -p} cache line name flags path base target bits i
    local -A wanted=()
    local -a patterns=()
    for base; do
        wanted[$base]=1
        patterns+=(-e "$base")
    done
    [ "${#patterns[@]}" -gt 0 ] || return 0
    cache=$($ldconfig) || die "BERTH_LDCONFIG: '$ldconfig' failed"
    # grep first: a shell loop over a whole host cache costs a tenth of a second
    cache=$(grep -F "${patterns[@]}" <<<"$cache" || true)
    local -a names=() bit_list=() paths=() targets=()
    while IFS= read -r line; do
        [[ $line == *" => "* ]] || continue
        line=${line#"${line%%[![:space:]]*}"}
        name=${line%% *} path=${line##* => }
        flags=${line#* (} flags=${flags%%)*}
        case $name in *.so.*) base=${name%%.so.*}.so ;; *) base=$name ;; esac
        [ -n "${wanted[$base]:-}" ] || continue
        case $flags in
            *64*) bits=64 ;;
            libc6) bits=32 ;;
            *) continue ;;
        esac
        names+=("$name") bit_list+=("$bits") paths+=("$path")
    done <<<"$cache"
    [ "${#paths[@]}" -gt 0 ] || return 0
    # One realpath for every entry, not a readlink each: a fork costs a
    # millisecond or more on some nodes and a driver has dozens of entries.
    # -m prints a line for every path, so the lines stay in step.
    mapfile -t targets < <(realpath -m -- "${paths[@]}")
    for i in "${!paths[@]}"; do
        target=${targets[$i]:-}
        if [ -f "$target" ]; then echo "${names[$i]} ${bit_list[$i]} $target"; fi
    done
}

# library_path_line DIRS: the LD_LIBRARY_PATH line that puts DIRS in front
# of the loader path the container's environment and earlier hooks (their
# $ENROOT_ENVIRON lines) left, or nothing when DIRS' first directory is on
# it already. (The caller's own LD_LIBRARY_PATH is the host's: not used.)
library_path_line() {
    local line current=
    if [ -f "${ENROOT_ENVIRON:?}" ]; then
        while IFS= read -r line; do
            if [[ $line == LD_LIBRARY_PATH=* ]]; then current=${line#*=}; fi
        done <"$ENROOT_ENVIRON"
    fi
    case ":$current:" in
        *":${1%%:*}:"*) ;;
        *) echo "LD_LIBRARY_PATH=$1${current:+:$current}" ;;
    esac
}

# The C library's own sonames, which an image keeps when a hook binds the
# node's libraries over the image's (a regular expression).
# shellcheck disable=SC2034  # (read by the hooks that source this file)
glibc='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libmvec|ld-linux[^.]*)\.so'

# image_libraries: the image's ld.so cache as "SONAME PATH" lines of its
# 64-bit entries (nothing where it has no cache, or a link in its place).
image_libraries() {
    local cache=$ENROOT_ROOTFS/etc/ld.so.cache
    [ -f "$cache" ] && [ ! -L "$cache" ] || return 0
    ldconfig -C "$cache" -p 2>/dev/null |
        awk -F ' => ' 'NF == 2 && $1 ~ /64/ { split($1, name, " "); sub(/^[ \t]+/, "", name[1]); print name[1], $2 }' || true
}
