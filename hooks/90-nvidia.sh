#!/bin/bash
# NVIDIA GPUs inside a container, as an enroot-protocol hook.
#
# Reads NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, NVIDIA_REQUIRE_*
# and NVIDIA_DISABLE_REQUIRE from the container's environment (the lines of
# $ENROOT_ENVIRON: data, never this hook's own environment); appends to $ENROOT_MOUNTS the GPU device nodes,
# the driver's libraries and programs, and to $ENROOT_ENVIRON LD_LIBRARY_PATH
# (and CUDA_VISIBLE_DEVICES when the GPUs came from Slurm's binding).
# With the compute capability, GDRCopy's /dev/gdrdrv and libgdrapi too, where
# the node has them.
#
# NVIDIA_VISIBLE_DEVICES: all | none | void | "" | comma list of indices
# (nvidia-smi order, i.e. PCI bus order), GPU-<uuid>, MIG-<uuid>. When it is
# unset, the GPUs are those Slurm bound to the step (SLURM_STEP_GPUS, else
# SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES, from the environment of berth
# start, which is the step's); "all" is narrowed to that binding
# too, so a CUDA image (which sets "all") gets only its job's GPUs, and on a
# node without GPUs it gets nothing and starts as a CPU container.
#
# Libraries are bound into /usr/local/nvidia/lib64 (32-bit: /usr/local/nvidia/lib)
# rather than the image's own library directory: NVIDIA's CUDA images already
# search there, nothing of the image is hidden, and no file inside the root
# has to be written, so a read-only root works. Other images find them through
# LD_LIBRARY_PATH, which this hook puts in front of the image's own.
#
# An Environment Definition File switches the hook off with the annotation
# com.hooks.nvidia.enable = false (BERTH_HOOK_NVIDIA_ENABLE=0); `no` or `false`
# there does the same.
#
# NVIDIA's CDI spec: where the node has one (kind nvidia.com/gpu, as
# `nvidia-ctk cdi generate` writes it to /etc/cdi or /var/run/cdi), the
# runtime lists its device names in BERTH_NVIDIA_CDI_GPUS; the GPUs chosen
# above are then asked for by their names there (the index, else GPU-<uuid>;
# MIG-<uuid> for a MIG device) in $BERTH_CDI_DEVICES, and the runtime applies
# the spec's edits (device nodes, libraries, its hooks) instead of this
# hook's own binding; NVIDIA_DRIVER_CAPABILITIES and the backend are then not
# used: the spec says what the driver is. A chosen GPU the spec lacks (a
# spec older than the GPUs) is refused. BERTH_NVIDIA_CDI=no (enroot.conf)
# leaves the list empty, and this hook finds the driver's files itself.
#
# Knobs, from the environment of berth start (the caller's; an image's or
# environ.d's variables are the container's and do not reach them):
#   BERTH_NVIDIA_BACKEND    ldcache (default: bind mounts from the ld.so cache)
#                           | nvidia-container-cli (libnvidia-container does it)
#   BERTH_NVIDIA_LIBRARIES  capability list (default: nvidia-libraries.conf beside this hook)
#   BERTH_LDCONFIG          command printing the ld.so cache (default: ldconfig -p)
#   BERTH_PROC_ROOT         where procfs is (default /proc)
#   BERTH_DEV_ROOT          where the device nodes are (default /dev)
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin nvidia BERTH_HOOK_NVIDIA_ENABLE yes
container_env NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES NVIDIA_DISABLE_REQUIRE 'NVIDIA_REQUIRE_*'

proc=${BERTH_PROC_ROOT:-/proc}
dev=${BERTH_DEV_ROOT:-/dev}
conf=${BERTH_NVIDIA_LIBRARIES:-$here/nvidia-libraries.conf}
backend=${BERTH_NVIDIA_BACKEND:-ldcache}
lib64_dir=/usr/local/nvidia/lib64
lib32_dir=/usr/local/nvidia/lib
capabilities_known=" compute utility video graphics display ngx compat32 all "
uuid_re='[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}'
constraint_re='^(cuda|driver|arch|brand)(>=|<=|==|!=|=|>|<)(.+)$'

# The GPUs of this node in index order: the driver's per-GPU procfs
# directories are named by PCI bus id, which is nvidia-smi's index order.
gpu_minor=()
gpu_uuid=()
load_gpus() {
    local info key value minor uuid
    for info in "$proc"/driver/nvidia/gpus/*/information; do
        [ -r "$info" ] || continue
        minor='' uuid=''
        while IFS=: read -r key value; do
            value=${value//[[:space:]]/}
            case $key in
                "Device Minor") minor=$value ;;
                "GPU UUID") uuid=${value,,} ;;
            esac
        done <"$info"
        [[ $minor =~ ^[0-9]+$ ]] || die "$info: no Device Minor line"
        gpu_minor+=("$minor")
        gpu_uuid+=("$uuid")
    done
}

# MIG-<uuid> -> index of its parent GPU, from `nvidia-smi -L`, which lists
# each GPU's MIG devices under it.
mig_parent() {
    local mig=${1,,} line parent=''
    command -v nvidia-smi >/dev/null || return 1
    while read -r line; do
        line=${line,,}
        case $line in
            "gpu "*) parent=${line##*uuid: } parent=${parent%)} ;;
            "mig "*"uuid: $mig)") index_of_uuid "$parent"; return ;;
        esac
    done < <(nvidia-smi -L)
    return 1
}

index_of_uuid() {
    local i
    for i in "${!gpu_uuid[@]}"; do
        [ "${gpu_uuid[$i]}" = "${1,,}" ] && echo "$i" && return 0
    done
    return 1
}

# Parse a device list into selected_gpus (indices) and selected_migs (uuids).
declare -A selected_gpus=()
selected_migs=()
select_devices() { # VARIABLE LIST
    each_device "$1" "$2" GPU "${#gpu_minor[@]}" select_gpu
}

select_gpu() { # VARIABLE index N | VARIABLE name ITEM (each_device's handler)
    local variable=$1 item=$3 index
    if [ "$2" = index ]; then
        selected_gpus[$item]=1
    elif [[ $item =~ ^GPU-$uuid_re$ ]]; then
        index=$(index_of_uuid "$item") || die "$variable: no GPU $item on this node"
        selected_gpus[$index]=1
    elif [[ $item =~ ^MIG-$uuid_re$ ]]; then
        index=$(mig_parent "$item") || die "$variable: no MIG device $item on this node"
        selected_gpus[$index]=1
        selected_migs+=("$item")
    else
        die "$variable: '$item' is neither a GPU index, a GPU-<uuid> nor a MIG-<uuid>"
    fi
}

# slurm_binding OUT: Slurm's binding of GPUs to this step into the variable
# named OUT, as "VARIABLE=VALUE", or empty (through a nameref, not printed:
# a $(...) would fork in every container start).
# shellcheck disable=SC2034  # binding_out is the caller's variable
slurm_binding() {
    local -n binding_out=$1
    local variable
    binding_out=''
    for variable in SLURM_STEP_GPUS SLURM_JOB_GPUS CUDA_VISIBLE_DEVICES; do
        if [ -n "${!variable:-}" ]; then
            binding_out="$variable=${!variable}"
            return
        fi
    done
}

# NVIDIA_DRIVER_CAPABILITIES -> the set "capabilities" (compat32 kept apart).
declare -A capabilities=()
want_compat32=no
parse_capabilities() {
    local list=${NVIDIA_DRIVER_CAPABILITIES:-utility,compute} item every
    local -a items
    IFS=, read -ra items <<<"$list"
    for item in "${items[@]}"; do
        item=${item//[[:space:]]/}
        [[ $capabilities_known == *" $item "* ]] ||
            die "NVIDIA_DRIVER_CAPABILITIES: unknown capability '$item'"
        case $item in
            all) for every in $capabilities_known; do capabilities[$every]=1; done ;;
            *) capabilities[$item]=1 ;;
        esac
    done
    [ -z "${capabilities[compat32]:-}" ] || want_compat32=yes
}

# The capability list: fill wanted_libs (base names), wanted_bins, wanted_files.
declare -A wanted_libs=()
wanted_bins=()
wanted_files=()
read_library_list() {
    local number=0 line capability kind name extra
    [ -r "$conf" ] || die "BERTH_NVIDIA_LIBRARIES: cannot read $conf"
    while IFS= read -r line || [ -n "$line" ]; do
        number=$((number + 1))
        line=${line%%#*}
        read -r capability kind name extra <<<"$line" || true
        [ -n "${capability:-}" ] || continue
        [[ -n ${name:-} && -z ${extra:-} ]] ||
            die "$conf:$number: want 'CAPABILITY KIND NAME', got '$line'"
        case " $capability " in
            " all " | " compat32 ") die "$conf:$number: '$capability' cannot be listed" ;;
            *) [[ $capabilities_known == *" $capability "* ]] ||
                die "$conf:$number: unknown capability '$capability'" ;;
        esac
        case $kind in
            lib | bin) ;;
            file) [[ $name == /* ]] || die "$conf:$number: a file must be an absolute path, got '$name'" ;;
            *) die "$conf:$number: unknown kind '$kind' (lib, bin or file)" ;;
        esac
        [ -n "${capabilities[$capability]:-}" ] || continue
        case $kind in
            lib) wanted_libs[$name]=1 ;;
            bin) wanted_bins+=("$name") ;;
            file) wanted_files+=("$name") ;;
        esac
    done <"$conf"
}

# Whether NVIDIA_REQUIRE_* is enforced: NVIDIA_DISABLE_REQUIRE unset or false.
requirements_enforced() {
    case ${NVIDIA_DISABLE_REQUIRE:-} in "" | 0 | false | no | n) return 0 ;; esac
    return 1
}

# version_le A B: A <= B in version order.
version_le() {
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]
}

version_holds() { # VERSION OP WANTED
    case $2 in
        ">=") version_le "$3" "$1" ;;
        "<=") version_le "$1" "$3" ;;
        ">") ! version_le "$1" "$3" ;;
        "<") ! version_le "$3" "$1" ;;
        "=" | "==") version_le "$1" "$3" && version_le "$3" "$1" ;;
        "!=") ! { version_le "$1" "$3" && version_le "$3" "$1"; } ;;
    esac
}

# NVIDIA_REQUIRE_*: space-separated alternatives of comma-separated
# constraints. Checked only where the driver's CUDA version is known (from
# nvidia-smi); arch= and brand= constraints are taken as met.
check_requirements() {
    local variable alternative term key op wanted have driver='' cuda='' met
    local -a alternatives terms words
    requirements_enforced || return 0
    compgen -v NVIDIA_REQUIRE_ >/dev/null || return 0
    command -v nvidia-smi >/dev/null || return 0
    cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)
    [ -n "$cuda" ] || return 0
    read -ra words <"$proc/driver/nvidia/version" || true
    for term in "${words[@]}"; do
        if [[ $term =~ ^[0-9]+\.[0-9]+(\.[0-9]+)*$ ]]; then driver=$term; break; fi
    done
    for variable in $(compgen -v NVIDIA_REQUIRE_); do
        read -ra alternatives <<<"${!variable}"
        [ "${#alternatives[@]}" -gt 0 ] || continue
        met=no
        for alternative in "${alternatives[@]}"; do
            IFS=, read -ra terms <<<"$alternative"
            met=yes
            for term in "${terms[@]}"; do
                [[ $term =~ $constraint_re ]] ||
                    die "$variable: cannot read constraint '$term'"
                key=${BASH_REMATCH[1]} op=${BASH_REMATCH[2]} wanted=${BASH_REMATCH[3]}
                case $key in
                    cuda) have=$cuda ;;
                    driver) have=$driver ;;
                    *) continue ;;
                esac
                { [ -n "$have" ] && version_holds "$have" "$op" "$wanted"; } || { met=no; break; }
            done
            [ "$met" = no ] || break
        done
        [ "$met" = yes ] ||
            die "$variable: '${!variable}' is not met by this node (driver ${driver:-unknown}, CUDA $cuda)"
    done
}

environ=()

bind_devices() {
    local index node
    for ((index = 0; index < ${#gpu_minor[@]}; index++)); do
        [ -n "${selected_gpus[$index]:-}" ] || continue
        node=$dev/nvidia${gpu_minor[$index]}
        [ -c "$node" ] || die "$node: GPU $index's device node is missing"
        bind "$node" "/dev/nvidia${gpu_minor[$index]}" bind,nosuid,noexec,x-create=file
    done
    [ -c "$dev/nvidiactl" ] || die "$dev/nvidiactl: missing (is the nvidia driver loaded?)"
    for node in nvidiactl nvidia-uvm nvidia-uvm-tools nvidia-modeset; do
        if [ -c "$dev/$node" ]; then
            bind "$dev/$node" "/dev/$node" bind,nosuid,noexec,x-create=file
        fi
    done
    if [ -n "${capabilities[compute]:-}" ] && [ ! -c "$dev/nvidia-uvm" ]; then
        echo "nvidia hook: warning: $dev/nvidia-uvm missing (nvidia_uvm not loaded?): CUDA will not start" >&2
    fi
    if [ "${#selected_migs[@]}" -gt 0 ] && [ -d "$dev/nvidia-caps" ]; then
        bind "$dev/nvidia-caps" /dev/nvidia-caps bind,nosuid,noexec,x-create=dir
    fi
    # GDRCopy (the CPU mapping GPU memory, for low-latency copies and
    # UCX/NCCL transports): its device and its user library, where the node
    # has the gdrdrv module; the library alone would be of no use.
    if [ -n "${capabilities[compute]:-}" ] && [ -c "$dev/gdrdrv" ]; then
        bind "$dev/gdrdrv" /dev/gdrdrv bind,nosuid,noexec,x-create=file
        wanted_libs[libgdrapi.so]=1
    fi
}

# The bin directories beside the driver's library directories (program_path).
declare -A driver_bin_dirs=()

# Every cache entry named after a wanted library, native (64-bit) and, with
# compat32, 32-bit; the entry's name stays (it is the soname programs ask
# for), its file is the resolved target.
bind_libraries() {
    local entries name bits target dirs=$lib64_dir line parent
    [ "${#wanted_libs[@]}" -gt 0 ] || return 0
    entries=$(ld_cache_entries "${!wanted_libs[@]}") || exit 1
    while read -r name bits target; do
        if [ "$bits" = 64 ]; then
            bind "$target" "$lib64_dir/$name" bind,ro,nosuid,x-create=file
            parent=${target%/*}
            driver_bin_dirs[${parent%/*}/bin]=1
        elif [ "$want_compat32" = yes ]; then
            bind "$target" "$lib32_dir/$name" bind,ro,nosuid,x-create=file
            dirs=$lib64_dir:$lib32_dir
        fi
    done <<<"$entries"
    line=$(library_path_line "$dirs")
    if [ -n "$line" ]; then environ+=("$line"); fi
}

# program_path OUT NAME: into the variable named OUT, what to bind for NAME:
# the first executable ELF file called NAME on PATH or in a driver's own bin
# directory (beside the directory of its bound libraries: a driver mounted
# into a containerized node at /usr/local/nvidia has /usr/local/nvidia/bin),
# else the first file found. A node's PATH may find a wrapper script that execs a path the
# container lacks (seen on a GPU machine: /usr/bin/nvidia-smi running
# /usr/local/nvidia/bin/nvidia-smi).
program_path() {
    local -n program_out=$1
    local dir candidate first='' magic
    local -a dirs
    IFS=: read -ra dirs <<<"${PATH:-}"
    for dir in "${dirs[@]}" "${!driver_bin_dirs[@]}"; do
        candidate=$dir/$2
        [[ -f $candidate && -x $candidate ]] || continue
        if [ -L "$candidate" ]; then candidate=$(readlink -f "$candidate"); fi
        magic=''
        IFS= read -r -n 4 magic <"$candidate" || true
        if [ "$magic" = $'\x7fELF' ]; then
            program_out=$candidate
            return 0
        fi
        first=${first:-$candidate}
    done
    program_out=$first
    [ -n "$program_out" ]
}

bind_programs_and_files() {
    local name path program
    for name in "${wanted_bins[@]}"; do
        program_path program "$name" || continue
        bind "$program" "/usr/bin/$name" bind,ro,nosuid,x-create=file
    done
    for path in "${wanted_files[@]}"; do
        if [ -e "$path" ]; then
            bind "$path" "$path" bind,nosuid,noexec,x-create=file
        fi
    done
}

# counting_list OUT N: into the variable named OUT, "0,1,...,N-1" (no seq:
# every fork counts).
counting_list() {
    local -n list_out=$1
    local i
    list_out=''
    for ((i = 0; i < $2; i++)); do list_out+=${list_out:+,}$i; done
}

# Inside, the driver numbers only the GPUs it can see, from 0: Slurm's
# numbering of host GPUs must not reach the container.
renumber_cuda_devices() {
    local list
    if [ "${#selected_migs[@]}" -gt 0 ]; then
        list=$(IFS=,; echo "${selected_migs[*]}")
    else
        counting_list list "${#selected_gpus[@]}"
    fi
    environ+=("CUDA_VISIBLE_DEVICES=$list")
}

# cdi_name OUT NAME...: into OUT, the first NAME that is a device of the
# node's CDI spec.
# shellcheck disable=SC2034  # name_out is the caller's variable
cdi_name() {
    local -n name_out=$1
    local candidate
    shift
    for candidate in "$@"; do
        if [[ " $BERTH_NVIDIA_CDI_GPUS " == *" $candidate "* ]]; then
            name_out=$candidate
            return 0
        fi
    done
    return 1
}

# The chosen GPUs (or MIG devices) as devices of the node's CDI spec, for
# the runtime to apply; a MIG device's entry has its parent's nodes.
request_cdi_devices() {
    local index name mig
    local -a names=()
    for mig in "${selected_migs[@]}"; do
        cdi_name name "$mig" ||
            die "MIG device $mig is not a device of the node's CDI spec (nvidia.com/gpu:" \
                "$BERTH_NVIDIA_CDI_GPUS): regenerate it (nvidia-ctk cdi generate) or set BERTH_NVIDIA_CDI=no"
        names+=("nvidia.com/gpu=$name")
    done
    for ((index = 0; index < ${#gpu_minor[@]}; index++)); do
        [ "${#selected_migs[@]}" -eq 0 ] || break
        [ -n "${selected_gpus[$index]:-}" ] || continue
        cdi_name name "$index" "GPU-${gpu_uuid[$index]#gpu-}" ||
            die "GPU $index is not a device of the node's CDI spec (nvidia.com/gpu:" \
                "$BERTH_NVIDIA_CDI_GPUS): regenerate it (nvidia-ctk cdi generate) or set BERTH_NVIDIA_CDI=no"
        names+=("nvidia.com/gpu=$name")
    done
    printf '%s\n' "${names[@]}" >>"${BERTH_CDI_DEVICES:?}"
}

run_container_cli() {
    local capability list variable
    local -a args
    command -v nvidia-container-cli >/dev/null ||
        die "BERTH_NVIDIA_BACKEND: nvidia-container-cli not found on PATH"
    list=$(printf '%s\n' "${!selected_gpus[@]}" | sort -n | paste -sd,)
    [ "${#selected_migs[@]}" -eq 0 ] || list=$(IFS=,; echo "${selected_migs[*]}")
    args=(--user configure --no-cgroups "--ldconfig=@$(command -v ldconfig)"
        "--device=$list" "--pid=${ENROOT_PID:?}")
    for capability in "${!capabilities[@]}"; do
        [ "$capability" = all ] || args+=("--$capability")
    done
    if requirements_enforced; then
        for variable in $(compgen -v NVIDIA_REQUIRE_ || true); do
            args+=("--require=${!variable}")
        done
    fi
    nvidia-container-cli "${args[@]}" "${ENROOT_ROOTFS:?}" ||
        die "nvidia-container-cli failed for GPUs $list"
}

main() {
    local binding='' list
    case $backend in
        ldcache | nvidia-container-cli) ;;
        *) die "BERTH_NVIDIA_BACKEND: unknown backend '$backend' (ldcache or nvidia-container-cli)" ;;
    esac
    if [ -z "${NVIDIA_VISIBLE_DEVICES+set}" ]; then
        slurm_binding binding
        [ -n "$binding" ] || exit 0
    else
        case $NVIDIA_VISIBLE_DEVICES in
            "" | none | void) exit 0 ;;
            all) slurm_binding binding ;;
        esac
    fi

    parse_capabilities
    load_gpus
    if [ -n "$binding" ]; then
        # A job's binding means nothing on a node without GPUs (a CUDA image
        # on a CPU node); "-1" and Slurm's "NoDevFiles" hide every GPU.
        case ${binding#*=} in -1 | NoDevFiles) exit 0 ;; esac
        [ "${#gpu_minor[@]}" -gt 0 ] || exit 0
        select_devices "${binding%%=*}" "${binding#*=}"
    elif [ "$NVIDIA_VISIBLE_DEVICES" = all ]; then
        [ "${#gpu_minor[@]}" -gt 0 ] || exit 0
        counting_list list "${#gpu_minor[@]}"
        select_devices NVIDIA_VISIBLE_DEVICES "$list"
    else
        select_devices NVIDIA_VISIBLE_DEVICES "$NVIDIA_VISIBLE_DEVICES"
    fi
    [ "${#selected_gpus[@]}" -gt 0 ] || exit 0
    [ -z "$binding" ] || renumber_cuda_devices

    if [ -n "${BERTH_NVIDIA_CDI_GPUS:-}" ]; then
        check_requirements
        request_cdi_devices
    elif [ "$backend" = nvidia-container-cli ]; then
        run_container_cli
    else
        read_library_list
        check_requirements
        bind_devices
        bind_libraries
        bind_programs_and_files
        flush_mounts
    fi
    [ "${#environ[@]}" -eq 0 ] || printf '%s\n' "${environ[@]}" >>"${ENROOT_ENVIRON:?}"
}

main "$@"
