#!/bin/bash
# The node's Slurm client commands inside a container whose image has none
# (workflow managers, Jupyter, launchers that start steps or submit jobs),
# as an enroot-protocol hook.
#
# On with BERTH_HOOK_SLURM_ENABLE: the site's default in enroot.conf (off
# unless the admin says so), over it the job's environment
# (`BERTH_HOOK_SLURM_ENABLE=yes srun ...`), over both an EDF's
# com.hooks.slurm.enabled = "true" (or .enable = true). Then, read-only:
#   - the node's client commands it has (srun, sbatch, squeue, ...) under
#     /usr/local/berth/slurm/bin, each run by a wrapper in /usr/local/bin
#     through the node's own loader with the node's library directories
#     (under /usr/local/berth/slurm): the image's C library, older or
#     another one, never loads into them, and what they start (salloc's
#     shell) is the image's again;
#   - Slurm's plugin directory at its own path (the commands and the SPANK
#     plugins of plugstack.conf load from there), the directory of the
#     configuration the job uses (SLURM_CONF, configless nodes' cache
#     included; else /etc/slurm) at its own path, and munge's socket
#     directory, so that `srun --overlap` starts a step of the running job
#     and `sbatch` submits one, authenticated as the user.
# The job's SLURM_* variables are the container's already. The wrappers need
# the image's /bin/sh; the node's commands run without LD_PRELOAD and
# LD_AUDIT, which would load the image's libraries into them.
#
# An image with its own srun on its PATH keeps it (its Slurm may be set up
# for the site on purpose): the hook says so and binds nothing, unless
# com.hooks.slurm.replace = true (BERTH_HOOK_SLURM_REPLACE=1), which binds
# the node's wrappers over the image's commands too.
#
# Fails the start, in one line, when it is on and the node has no srun, or
# the image no /bin/sh. Knobs, from the environment of berth start (never
# the container's): BERTH_LDCONFIG (command printing the ld.so cache,
# default: ldconfig -p), BERTH_SLURM_PATH (where the node's commands are
# looked for, default /usr/local/bin:/usr/bin:/bin), BERTH_ETC_ROOT
# (default /etc), BERTH_MUNGE_DIR (default /run/munge).
set -eu -o pipefail

hook_name=slurm
here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")"); fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"

switch_on BERTH_HOOK_SLURM_ENABLE no || exit 0
replace=''
if switch_on BERTH_HOOK_SLURM_REPLACE no; then replace=1; fi

commands=(srun sbatch salloc sattach sbcast scancel scontrol sinfo squeue sacct sstat sprio sshare)
top=/usr/local/berth/slurm
etc=${BERTH_ETC_ROOT:-/etc}
search=${BERTH_SLURM_PATH:-/usr/local/bin:/usr/bin:/bin}
host_path=$PATH
container_env PATH  # (into PATH: the container's is kept aside, the hook's put back)
container_path=${PATH:-/usr/local/bin:/usr/bin:/bin}
PATH=$host_path

# A host path that goes into an fstab line: no spaces, no control characters.
plain_path() { # WHAT PATH
    [[ $2 == /* && $2 != *[[:space:][:cntrl:]]* ]] ||
        die "$1: '${2//[^[:print:]]/?}' is not an absolute path without spaces"
}

# The image's own srun, on the container's PATH, printed as the container
# sees it. A link counts (it may lead anywhere inside the image); an empty
# file does not: it is where an earlier start of a container made with
# `berth create` bound the node's wrapper, as every bind leaves its mount
# point behind.
image_srun() {
    local dir
    local -a dirs
    IFS=: read -ra dirs <<<"$container_path"
    for dir in "${dirs[@]}"; do
        [[ $dir == /* ]] || continue
        if [ -s "$ENROOT_ROOTFS$dir/srun" ] || [ -L "$ENROOT_ROOTFS$dir/srun" ]; then
            echo "$dir/srun"
            return 0
        fi
    done
    return 1
}

# The node's loader and library directories (each once, links resolved),
# from its ld.so cache: what the node's own loader would search. awk, not a
# shell loop: a node's cache has thousands of entries.
library_dirs=()
loader=''
find_libraries() {
    local ldconfig=${BERTH_LDCONFIG:-ldconfig -p} cache dir
    local -a found=()
    local -A seen=()
    cache=$($ldconfig) || die "BERTH_LDCONFIG: '$ldconfig' failed"
    mapfile -t found < <(awk -F ' => ' 'NF == 2 && $1 ~ /64/ {
            path = $2; dir = path; sub(/\/[^\/]*$/, "", dir)
            split($1, name, " "); if (!loader && name[1] ~ /^ld-linux.*\.so\.[0-9]$/) loader = path
            if (!(dir in seen)) { seen[dir] = 1; dirs[++n] = dir }
        }
        END { print loader; for (i = 1; i <= n; i++) print dirs[i] }' <<<"$cache")
    loader=${found[0]:-}
    [ -n "$loader" ] && [ -e "$loader" ] || die "no 64-bit ld-linux loader in the node's ld.so cache"
    # one realpath for all: a fork each costs more than the rest of the hook
    while IFS= read -r dir; do
        if [ -z "${seen[$dir]:-}" ] && [ -d "$dir" ]; then
            seen[$dir]=1
            library_dirs+=("$dir")
        fi
    done < <(realpath -m -- "${found[@]:1}")
    loader=$(realpath -- "$loader")
}

# Slurm's plugin directory: slurm.conf's PluginDir, else where the node's
# srun finds its libslurm (Debian's slurm-wlm keeps both together).
plugin_dir() { # CONF SRUN
    local line dir=''
    if [ -f "$1" ]; then
        while IFS= read -r line; do
            if [[ $line =~ ^[[:space:]]*[Pp]lugin[Dd]ir[[:space:]]*=[[:space:]]*([^[:space:]#]+) ]]; then
                dir=${BASH_REMATCH[1]%%:*}
            fi
        done <"$1"
    fi
    if [ -z "$dir" ]; then
        dir=$("$loader" --list "$2" 2>/dev/null |
            awk '$1 ~ /^libslurm/ && $3 ~ /^\// { sub(/\/[^\/]*$/, "", $3); print $3; exit }') || true
    fi
    echo "$dir"
}

main() {
    local srun own='' conf conf_dir plugins dir name i wrappers library_path
    local -a bin_dirs=() found=()
    local -A bin_index=()
    srun=$(PATH=$search type -P srun) ||
        die "it is on (BERTH_HOOK_SLURM_ENABLE), but this node has no srun in $search (BERTH_SLURM_PATH)"
    if own=$(image_srun); then
        if [ -z "$replace" ]; then
            echo "slurm hook: the image has its own $own; the node's commands are not bound" \
                "(com.hooks.slurm.replace = true binds them over it)" >&2
            exit 0
        fi
    fi
    [ -e "$ENROOT_ROOTFS/bin/sh" ] || [ -L "$ENROOT_ROOTFS/bin/sh" ] ||
        die "the image has no /bin/sh to run the node's Slurm commands through"
    find_libraries

    conf=${SLURM_CONF:-$etc/slurm/slurm.conf}
    plain_path SLURM_CONF "$conf"
    conf_dir=${conf%/*}
    plugins=$(plugin_dir "$conf" "$srun")
    [ -n "$plugins" ] && [ -d "$plugins" ] ||
        die "$srun: cannot tell Slurm's plugin directory (no PluginDir in $conf, no libslurm beside srun)"

    # The commands this node has, links resolved (by one realpath: a fork
    # each would cost more than the rest of the hook), by directory.
    local -a names=() programs=()
    for name in "${commands[@]}"; do
        dir=$(PATH=$search type -P "$name") || continue
        names+=("$name") programs+=("$dir")
    done
    mapfile -t programs < <(realpath -m -- "${programs[@]}")
    for i in "${!names[@]}"; do
        dir=${programs[$i]%/*}
        if [ -z "${bin_index[$dir]:-}" ]; then
            bin_index[$dir]=${#bin_dirs[@]}
            bin_dirs+=("$dir")
        fi
        found+=("${names[$i]}:${bin_index[$dir]}:${programs[$i]##*/}")
    done

    for i in "${!library_dirs[@]}"; do
        plain_path "the library directory" "${library_dirs[$i]}"
        bind "${library_dirs[$i]}" "$top/lib/$i" bind,ro,nosuid,nodev,x-create=dir
        library_path+=${library_path:+:}$top/lib/$i
    done
    bind "$loader" "$top/ld.so" bind,ro,nosuid,nodev,x-create=file
    for i in "${!bin_dirs[@]}"; do
        plain_path "the command directory" "${bin_dirs[$i]}"
        bind "${bin_dirs[$i]}" "$top/bin/$i" bind,ro,nosuid,nodev,x-create=dir
    done
    plain_path PluginDir "$plugins"
    bind "$plugins" "$plugins" bind,ro,nosuid,nodev,x-create=dir
    if [ -d "$conf_dir" ]; then
        bind "$conf_dir" "$conf_dir" bind,ro,nosuid,nodev,noexec,x-create=dir
    fi
    dir=${BERTH_MUNGE_DIR:-/run/munge}
    plain_path BERTH_MUNGE_DIR "$dir"
    if [ -d "$dir" ]; then
        bind "$dir" "$dir" bind,ro,nosuid,nodev,noexec,x-create=dir
    fi

    # One wrapper per command, bound at /usr/local/bin (on every PATH), and
    # over the image's own copies when replacing.
    wrappers=${BERTH_RUNTIME_DIR:?}/slurm-hook
    mkdir -p "$wrappers"
    plain_path BERTH_RUNTIME_DIR "$wrappers"
    for name in "${found[@]}"; do
        local file
        IFS=: read -r name i file <<<"$name"
        printf '#!/bin/sh\nunset LD_PRELOAD LD_AUDIT\nexec %s --library-path %s %s "$@"\n' \
            "$top/ld.so" "$library_path" "$top/bin/$i/$file" >"$wrappers/$name"
        bind "$wrappers/$name" "/usr/local/bin/$name" bind,ro,nosuid,nodev,x-create=file
        if [ -n "$own" ] && [ -e "$ENROOT_ROOTFS${own%/*}/$name" ]; then
            bind "$wrappers/$name" "${own%/*}/$name" bind,ro,nosuid,nodev
        fi
    done
    chmod 755 "$wrappers"/*
    flush_mounts
}

main "$@"
