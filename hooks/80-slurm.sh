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

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin slurm BERTH_HOOK_SLURM_ENABLE
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
loader='' pmix=''
find_libraries() {
    local ldconfig=${BERTH_LDCONFIG:-ldconfig -p} cache dir
    local -a found=()
    local -A seen=()
    cache=$($ldconfig) || die "BERTH_LDCONFIG: '$ldconfig' failed"
    mapfile -t found < <(awk -F ' => ' 'NF == 2 && $1 ~ /64/ {
            path = $2; dir = path; sub(/\/[^\/]*$/, "", dir)
            split($1, name, " "); if (!loader && name[1] ~ /^ld-linux.*\.so\.[0-9]$/) loader = path
            if (!pmix && name[1] == "libpmix.so.2") pmix = path
            if (!(dir in seen)) { seen[dir] = 1; dirs[++n] = dir }
        }
        END { print loader; print pmix; for (i = 1; i <= n; i++) print dirs[i] }' <<<"$cache")
    loader=${found[0]:-}
    [[ -n $loader && -e $loader ]] || die "no 64-bit ld-linux loader in the node's ld.so cache"
    # one realpath for all: a fork each costs more than the rest of the hook
    found[1]=${found[1]:-/nonexistent}
    {
        IFS= read -r loader
        IFS= read -r pmix
        while IFS= read -r dir; do
            if [ -z "${seen[$dir]:-}" ] && [ -d "$dir" ]; then
                seen[$dir]=1
                library_dirs+=("$dir")
            fi
        done
    } < <(realpath -m -- "${found[@]}")
    [ -f "$pmix" ] || pmix=''
}

# What the node's slurm.conf says of the plugin directory and SlurmUser
# (Slurm's defaults where it is silent: the plugin directory where the
# node's srun finds its libslurm, as Debian's slurm-wlm keeps both; root).
plugin_dir='' slurm_user=root
read_conf() { # CONF SRUN
    local line
    if [ -f "$1" ]; then
        while IFS= read -r line; do
            if [[ $line =~ ^[[:space:]]*[Pp]lugin[Dd]ir[[:space:]]*=[[:space:]]*([^[:space:]#]+) ]]; then
                plugin_dir=${BASH_REMATCH[1]%%:*}
            elif [[ $line =~ ^[[:space:]]*[Ss]lurm[Uu]ser[[:space:]]*=[[:space:]]*([^[:space:]#]+) ]]; then
                slurm_user=${BASH_REMATCH[1]}
            fi
        done <"$1"
    fi
    if [ -z "$plugin_dir" ]; then
        plugin_dir=$("$loader" --list "$2" 2>/dev/null |
            awk '$1 ~ /^libslurm/ && $3 ~ /^\// { sub(/\/[^\/]*$/, "", $3); print $3; exit }') || true
    fi
}

# The commands refuse a configuration whose SlurmUser they cannot look up:
# the node's entry for it joins the container's /etc/passwd, in a copy of
# the one the container will have (10-shadow.sh's, where it made one)
# bound over it, as 10-shadow.sh does for the caller.
known_slurm_user() { # CONF
    local passwd=${BERTH_RUNTIME_DIR:?}/passwd entry
    [ "$slurm_user" != root ] || return 0
    [[ $slurm_user =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$ ]] ||
        die "$1: SlurmUser '${slurm_user//[^[:print:]]/?}' is not a user name"
    if [ ! -f "$passwd" ]; then
        passwd=$ENROOT_ROOTFS/etc/passwd
        # a link could lead out of the container's root: such an image is left alone
        [ -f "$passwd" ] && [ ! -L "$passwd" ] || return 0
    fi
    awk -F: -v user="$slurm_user" '$1 == user { found = 1 } END { exit !found }' "$passwd" && return 0
    entry=$(getent passwd "$slurm_user") ||
        die "$1: SlurmUser $slurm_user is no user of this node"
    plain_path BERTH_RUNTIME_DIR "$BERTH_RUNTIME_DIR"
    { cat "$passwd"; printf '%s\n' "$entry"; } >"$BERTH_RUNTIME_DIR/slurm-passwd"
    bind "$BERTH_RUNTIME_DIR/slurm-passwd" /etc/passwd bind
}

main() {
    local srun own='' conf conf_dir dir name i wrappers library_path
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
    read_conf "$conf" "$srun"
    [[ -n $plugin_dir && -d $plugin_dir ]] ||
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
    plain_path PluginDir "$plugin_dir"
    bind "$plugin_dir" "$plugin_dir" bind,ro,nosuid,nodev,x-create=dir
    # Slurm's mpi/pmix plugin opens PMIx by the path it was built with, the
    # development name in PMIx's own directory: the node's library there,
    # and nothing else of the image's PMIx (its MPI keeps its libpmix.so.2).
    # Where the image has that name itself (its PMIx's development files;
    # an empty file is an earlier start's mount point), it is left alone:
    # a bind would follow its link onto the library the image's MPI loads.
    dir=$ENROOT_ROOTFS${pmix%/*}/libpmix.so
    if [ -n "$pmix" ] && [ ! -s "$dir" ] && [ ! -L "$dir" ]; then
        plain_path "the PMIx library" "$pmix"
        bind "$pmix" "${pmix%/*}/libpmix.so" bind,ro,nosuid,nodev,x-create=file
    fi
    if [ -d "$conf_dir" ]; then
        bind "$conf_dir" "$conf_dir" bind,ro,nosuid,nodev,noexec,x-create=dir
    fi
    dir=${BERTH_MUNGE_DIR:-/run/munge}
    plain_path BERTH_MUNGE_DIR "$dir"
    if [ -d "$dir" ]; then
        bind "$dir" "$dir" bind,ro,nosuid,nodev,noexec,x-create=dir
    fi

    known_slurm_user "$conf"

    # One wrapper per command, bound at /usr/local/bin (on every PATH), and
    # over the image's own copies when replacing. They are written into the
    # container's root, in the hook's own directory (an image's start writes
    # its tmpfs upper layer; a container made by `berth create`, its own
    # tree): the runtime directory may be mounted noexec, which a bind
    # keeps in a user namespace.
    wrappers=$ENROOT_ROOTFS$top/sbin
    make_in_root "$wrappers"
    for name in "${found[@]}"; do
        local file
        IFS=: read -r name i file <<<"$name"
        rm -f "$wrappers/$name"
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
