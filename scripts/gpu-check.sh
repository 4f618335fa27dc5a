#!/usr/bin/env bash
# The NVIDIA hook on a real GPU, end to end. CI has no GPU (the hook's tests,
# tests/test_hook_nvidia.py, run against a fabricated driver); this is the
# check for a machine that has one, run as root, with no network needed:
#
#   scripts/gpu-check.sh prepare DIR   on a development machine with Docker and
#       CUDA's nvcc: DIR/rootfs.tar.gz, Debian 12's root (the node image of
#       scripts/base-image.sh, trimmed), DIR/cuda-check, scripts/gpu-check.cu
#       built here against Debian 12's C library as PTX only, and
#       DIR/gpucheck.sif, that root with it as an Apptainer image (siftool)
#   scripts/gpu-check.sh run DIR       on the GPU machine: makes a throwaway
#       user, unpacks the root as her container, and checks, as her, what a
#       job gets from `berth start` with the checkout's runtime and hook
#
# Each check prints "ok" or "FAIL" and what it saw; the last line sums up and
# the exit status is 1 when a check failed. GDRCopy is checked where the
# machine has /dev/gdrdrv, NVIDIA's CDI spec where it has nvidia-ctk (the
# spec is generated into the run's own directory; /etc/cdi is not touched);
# each says so where it is skipped. Needs on the GPU machine: bash, python3 (3.10 or
# newer, with requests and tqdm), the driver (nvidia-smi), useradd, runuser, tar.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu-check: $*" >&2; exit 2; }

prepare() {
    local dir=$1 container rootfs
    mkdir -p "$dir"
    docker image inspect berth/node:bookworm-minbase >/dev/null 2>&1 || scripts/base-image.sh bookworm
    # PTX only (compute_75 runs on every GPU since Turing): the driver compiles
    # it when the program loads, with libnvidia-ptxjitcompiler.
    nvcc -O2 -cudart static -gencode arch=compute_75,code=compute_75 \
        -o "$dir/cuda-check" scripts/gpu-check.cu
    rootfs=$(mktemp -d)
    container=$(docker create berth/node:bookworm-minbase /bin/true)
    docker export "$container" | tar -x -C "$rootfs" --exclude='./dev/*' --exclude='dev/*'
    docker rm "$container" >/dev/null
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/* \
        "$rootfs"/usr/share/{doc,man,locale,info,zoneinfo}
    tar -C "$rootfs" -c . | gzip -9 >"$dir/rootfs.tar.gz"
    # The same root as an Apptainer image, a SIF file by siftool: the CUDA
    # program in it, and an environment script that puts it on PATH and
    # extends LD_LIBRARY_PATH as Apptainer's own base script does.
    mkdir -p "$rootfs/.singularity.d/env" "$rootfs/opt/gpu-check/bin"
    cp "$dir/cuda-check" "$rootfs/opt/gpu-check/bin/"
    apptainer_env >"$rootfs/.singularity.d/env/90-environment.sh"
    mksquashfs "$rootfs" "$dir/gpucheck.sqsh" -noappend -all-root -quiet -no-progress -comp xz
    rm -f "$dir/gpucheck.sif"
    siftool new "$dir/gpucheck.sif"
    siftool add "$dir/gpucheck.sif" "$dir/gpucheck.sqsh" --datatype 4 --parttype 2 --partfs 1 \
        --partarch 2
    rm -rf "$rootfs" "$dir/gpucheck.sqsh"
    ls -l "$dir"
}

apptainer_env() {
    # shellcheck disable=SC2016  # the image's environment script: its shell expands these
    printf '%s\n' 'export PATH="/opt/gpu-check/bin:$PATH"' \
        'LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/.singularity.d/libs"' \
        'export LD_LIBRARY_PATH'
}

passed=0
failures=0
check() { # NAME CONDITION-STATUS DETAIL
    if [ "$2" = 0 ]; then
        passed=$((passed + 1))
        printf 'ok    %s\n' "$1"
    else
        failures=$((failures + 1))
        printf 'FAIL  %s\n' "$1"
    fi
    [ -z "$3" ] || printf '%s\n' "$3" | sed 's/^/      /'
}

# as_job [VAR=VALUE...] -- BERTH-ARGS...: berth as the user would run it from
# a job step, with the caller's environment reduced to what is named.
as_job() {
    local -a env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    "${runner[@]}" env -i "HOME=$home" "PATH=$work/bin:/usr/local/bin:/usr/bin:/bin" \
        "ENROOT_SYSCONF_PATH=$work/etc" "XDG_DATA_HOME=$data" \
        ${ldconfig:+"BERTH_LDCONFIG=$ldconfig"} "${env[@]}" berth "$@"
}

# The file of LIBRARY's 64-bit entry in the ld.so cache the hook reads.
host_library() {
    ${ldconfig:-ldconfig -p} | awk -v name="$1" '$1 == name && /x86-64|64bit/ { print $NF; exit }'
}

refused() { # VARIABLE OUTPUT: berth's one line, the hook's reason naming VARIABLE
    [ "$(wc -l <<<"$2")" = 1 ] && grep -q "^berth: error: hook 90-nvidia.sh: nvidia hook: $1" <<<"$2"
}

median_ms() { # COMMAND...: the median of five runs, in milliseconds
    local start
    local -a times=()
    for _ in 1 2 3 4 5; do
        start=$(date +%s%N)
        "$@" >/dev/null 2>&1 || true
        times+=($((($(date +%s%N) - start) / 1000000)))
    done
    printf '%s\n' "${times[@]}" | sort -n | sed -n 3p
}

run_checks() {
    local out rc host_list count sums lib inside outside gpu_start plain_start hook_alone
    host_list=$(nvidia-smi -L)
    count=$(grep -c '^GPU ' <<<"$host_list")
    local all_gpus=NVIDIA_VISIBLE_DEVICES=all
    local with_cuda=(-m "$work/bin/cuda-check:/usr/local/bin/cuda-check")

    out=$(as_job -- start gpucheck true 2>&1) && rc=0 || rc=$?
    check "$who starts a container" "$rc" "$out"
    [ "$rc" = 0 ] || return 1

    out=$(as_job -- start -e "$all_gpus" gpucheck nvidia-smi -L 2>&1) && rc=0 || rc=$?
    [ "$rc" = 0 ] && [ "$out" = "$host_list" ] && rc=0 || rc=1
    check "NVIDIA_VISIBLE_DEVICES=all: nvidia-smi -L inside lists the host's GPUs" "$rc" "$out"

    rc=0 sums=''
    for lib in libnvidia-ml.so.1 libcuda.so.1; do
        outside=$(sha256sum <"$(host_library "$lib")" | cut -d' ' -f1)
        inside=$(as_job -- start -e "$all_gpus" gpucheck \
            sh -c "sha256sum </usr/local/nvidia/lib64/$lib" 2>&1 | cut -d' ' -f1) || true
        [ "$inside" = "$outside" ] || rc=1
        sums+="$lib: inside $inside, host $outside"$'\n'
    done
    check "the driver's libraries inside are the host's files" "$rc" "${sums%$'\n'}"

    out=$(as_job -- start -e "$all_gpus" "${with_cuda[@]}" gpucheck cuda-check 2>&1) && rc=0 || rc=$?
    check "a CUDA program (PTX, JIT-compiled by the driver) computes on the GPU inside" "$rc" "$out"

    out=$(as_job -- start -r -w -e "$all_gpus" "${with_cuda[@]}" gpucheck cuda-check 2>&1) && rc=0 || rc=$?
    check "the same with --root and --rw" "$rc" "$out"

    # shellcheck disable=SC2016  # expanded by the container's shell
    out=$(as_job SLURM_STEP_GPUS=0 -- start gpucheck \
        sh -c 'nvidia-smi -L; echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"' 2>&1) && rc=0 || rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c '^GPU ' <<<"$out")" = 1 ] &&
        grep -qx 'CUDA_VISIBLE_DEVICES=0' <<<"$out" || rc=1
    check "Slurm's binding alone (SLURM_STEP_GPUS=0): one GPU, CUDA_VISIBLE_DEVICES=0" "$rc" "$out"

    # Earlier starts of this (persistent) container left the empty files
    # their bind mounts were made on, as enroot's do: what counts is what is
    # mounted. The host's /dev is the container's, as in enroot, unless
    # ENROOT_RESTRICT_DEV: then only what the hook binds.
    out=$(as_job -- start gpucheck grep -E 'nvidia|libcuda' /proc/self/mountinfo 2>&1) && rc=1 || rc=0
    check "nothing asked for: no driver library and no nvidia-smi mounted inside" "$rc" "$out"

    out=$(as_job ENROOT_RESTRICT_DEV=yes -- start gpucheck sh -c 'ls /dev | grep nvidia' 2>&1) && rc=1 || rc=0
    [ -z "$out" ] || rc=1
    check "nothing asked for, ENROOT_RESTRICT_DEV=yes: no GPU device inside" "$rc" "$out"

    out=$(as_job ENROOT_RESTRICT_DEV=yes -- start -e "$all_gpus" "${with_cuda[@]}" gpucheck \
        sh -c 'ls /dev | grep nvidia && cuda-check' 2>&1) && rc=0 || rc=$?
    check "ENROOT_RESTRICT_DEV=yes: the hook's device nodes alone, and CUDA computes" "$rc" "$out"

    out=$(as_job -- start -e "$all_gpus" -e NVIDIA_DRIVER_CAPABILITIES=utility gpucheck \
        sh -c 'nvidia-smi -L && ! grep libcuda /proc/self/mountinfo' 2>&1) && rc=0 || rc=$?
    check "NVIDIA_DRIVER_CAPABILITIES=utility: nvidia-smi, no libcuda" "$rc" "$out"

    # A refusal is berth's one line naming the hook that failed (as enroot
    # says which hook failed), then the hook's reason naming the variable.
    out=$(as_job -- start -e "NVIDIA_VISIBLE_DEVICES=$count" gpucheck true 2>&1) && rc=1 || rc=0
    refused NVIDIA_VISIBLE_DEVICES "$out" || rc=1
    check "a GPU the node lacks (NVIDIA_VISIBLE_DEVICES=$count) is refused, named" "$rc" "$out"

    out=$(as_job -- start -e "$all_gpus" -e 'NVIDIA_REQUIRE_CUDA=cuda>=99.0' gpucheck true 2>&1) && rc=1 || rc=0
    refused NVIDIA_REQUIRE_CUDA "$out" || rc=1
    check "an unmet NVIDIA_REQUIRE_CUDA is refused, named" "$rc" "$out"

    if [ -c /dev/gdrdrv ]; then
        out=$(as_job -- start -e "$all_gpus" gpucheck \
            sh -c 'test -c /dev/gdrdrv && ls /usr/local/nvidia/lib64' 2>&1) && rc=0 || rc=$?
        if [ -n "$(host_library libgdrapi.so.2)" ]; then grep -q libgdrapi <<<"$out" || rc=1; fi
        check "GDRCopy: /dev/gdrdrv (and libgdrapi where the host has it) inside" "$rc" "$out"
    else
        echo "info  GDRCopy not checked: this machine has no /dev/gdrdrv"
    fi

    # An Apptainer image: the SIF file started in place where this machine
    # has squashfuse, else its root unpacked (the same /.singularity.d).
    local sif_target=gpucheck-sif sif_how="its root unpacked (no squashfuse or /dev/fuse here)"
    if command -v squashfuse >/dev/null && [ -r /dev/fuse ] && [ -w /dev/fuse ]; then
        sif_target=$work/gpucheck.sif sif_how="the SIF file started in place"
    fi
    # shellcheck disable=SC2016  # expanded by the container's shell
    out=$(as_job -- start -e "$all_gpus" "$sif_target" sh -c \
        'cuda-check && nvidia-smi -L && echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"' 2>&1) && rc=0 || rc=$?
    grep -q '^LD_LIBRARY_PATH=.*/.singularity.d/libs$' <<<"$out" || rc=1
    check "an Apptainer image ($sif_how): its env script's PATH and LD_LIBRARY_PATH, CUDA computes" "$rc" "$out"

    if command -v nvidia-ctk >/dev/null; then
        cdi_checks
    else
        echo "info  CDI not checked: no nvidia-ctk on PATH (NVIDIA's nvidia-container-toolkit-base)"
    fi

    hook_alone=$(median_ms "${runner[@]}" env -i "PATH=/usr/bin:/bin" ENROOT_PID=1 \
        "ENROOT_ROOTFS=$work/none" "ENROOT_MOUNTS=$work/hook-mounts" "ENROOT_ENVIRON=$work/hook-environ" \
        ${ldconfig:+"BERTH_LDCONFIG=$ldconfig"} "$work/hooks/90-nvidia.sh")
    echo "info  the hook alone, NVIDIA_VISIBLE_DEVICES=all, median of 5: $hook_alone ms"
    plain_start=$(median_ms as_job -- start gpucheck true)
    gpu_start=$(median_ms as_job -- start -e "$all_gpus" gpucheck true)
    echo "info  berth start gpucheck true, median of 5: $plain_start ms without a GPU, $gpu_start ms with all GPUs"
}

# NVIDIA's CDI spec, generated into $work/cdi (root's, as the runtime
# requires): the GPUs by name with --device, and a job's GPU taken from the
# spec by the hook, instead of its own binding into /usr/local/nvidia.
cdi_checks() {
    local out rc specs=$work/cdi
    local with_cuda=(-m "$work/bin/cuda-check:/usr/local/bin/cuda-check")
    if [ ! -r "$specs/nvidia.yaml" ]; then
        mkdir -p "$specs"
        out=$(nvidia-ctk cdi generate --output="$specs/nvidia.yaml" 2>&1) && rc=0 || rc=$?
        check "nvidia-ctk cdi generate writes a spec" "$rc" "$(tail -n 3 <<<"$out")"
        [ "$rc" = 0 ] || return 0
        chmod 644 "$specs/nvidia.yaml"
    fi

    out=$(as_job "BERTH_CDI_SPEC_DIRS=$specs" -- start --device nvidia.com/gpu=all "${with_cuda[@]}" \
        gpucheck sh -c 'nvidia-smi -L && cuda-check && ldconfig -p | grep -q "libcuda\.so\.1 "' \
        2>&1) && rc=0 || rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c '^GPU ' <<<"$out")" = "$(nvidia-smi -L | grep -c '^GPU ')" ] || rc=1
    # the spec's update-ldcache hook ran ldconfig in the root, from namespaces of its own
    check "--device nvidia.com/gpu=all: every GPU from the spec, CUDA computes, libcuda in ld.so.cache" \
        "$rc" "$out"

    out=$(as_job "BERTH_CDI_SPEC_DIRS=$specs" SLURM_STEP_GPUS=0 -- start "${with_cuda[@]}" gpucheck \
        sh -c 'nvidia-smi -L && cuda-check && ! grep -q " /usr/local/nvidia/" /proc/self/mountinfo' \
        2>&1) && rc=0 || rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c '^GPU ' <<<"$out")" = 1 ] || rc=1
    check "the spec on the node, SLURM_STEP_GPUS=0: one GPU from it, not the hook's binding" "$rc" "$out"
}

# unpack_roots DIR [RUNNER...]: the containers gpucheck and gpucheck-sif
# (the same root with the SIF's /.singularity.d) in $data/enroot, as RUNNER.
unpack_roots() {
    local dir=$1 name
    shift
    for name in gpucheck gpucheck-sif; do
        "$@" mkdir -p "$data/enroot/$name"
        gzip -dc <"$dir/rootfs.tar.gz" | "$@" tar -x -C "$data/enroot/$name" || return 1
    done
    "$@" mkdir -p "$data/enroot/gpucheck-sif/.singularity.d/env" \
        "$data/enroot/gpucheck-sif/opt/gpu-check/bin"
    apptainer_env | "$@" tee "$data/enroot/gpucheck-sif/.singularity.d/env/90-environment.sh" >/dev/null
    "$@" cp "$work/bin/cuda-check" "$data/enroot/gpucheck-sif/opt/gpu-check/bin/"
}

run() {
    local dir python
    dir=$(realpath "$1")
    [ "$(id -u)" = 0 ] || die "run it as root (it makes a throwaway user)"
    [[ -r $dir/rootfs.tar.gz && -x $dir/cuda-check && -r $dir/gpucheck.sif ]] ||
        die "$dir: no rootfs.tar.gz, cuda-check and gpucheck.sif (scripts/gpu-check.sh prepare $dir)"
    command -v nvidia-smi >/dev/null || die "no nvidia-smi: is the NVIDIA driver installed?"
    python=$(command -v python3) || die "no python3"
    "$python" -c 'import sys, requests, tqdm; sys.exit(sys.version_info < (3, 10))' 2>/dev/null ||
        die "$python: Python 3.10 or newer with requests and tqdm is needed"

    echo "== this machine"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    uname -r
    ls -ld /dev/*nvidia* /dev/*gdrdrv* 2>/dev/null || true
    ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so|libgdrapi' || true

    work=$(mktemp -d /tmp/berth-gpu-check.XXXXXX)
    chmod 755 "$work"
    user=berth-gpu-check
    created=''
    trap 'rm -rf "$work"; [ -z "$created" ] || userdel -r "$user" 2>/dev/null || true' EXIT
    mkdir -p "$work/runtime" "$work/bin" "$work/etc/hooks.d"
    cp -r runtime/berth "$work/runtime/"
    cp -r hooks "$work/"
    ln -s "$work/hooks/90-nvidia.sh" "$work/etc/hooks.d/90-nvidia.sh"
    cp "$dir/cuda-check" "$dir/gpucheck.sif" "$work/bin/"
    mv "$work/bin/gpucheck.sif" "$work/"
    printf '#!/bin/sh\nPYTHONPATH=%s/runtime exec %s -c "import sys; from berth.cli import main; sys.exit(main())" "$@"\n' \
        "$work" "$python" >"$work/bin/berth"
    echo NVIDIA_VISIBLE_DEVICES=all >"$work/hook-environ"
    touch "$work/hook-mounts"
    chmod -R a+rwX "$work/hook-environ" "$work/hook-mounts"
    chmod -R a+rX "$work"
    chmod 755 "$work/bin/berth"

    # The hook reads the ld.so cache; a machine whose driver libraries are
    # not in it (a driver mounted in from outside) gets a cache of their
    # directory through the hook's BERTH_LDCONFIG knob, said here.
    ldconfig=''
    if [ -z "$(host_library libnvidia-ml.so.1)" ]; then
        local found
        found=$(find /usr/local/nvidia /usr/lib64 /usr/lib /lib64 -name 'libnvidia-ml.so.1' -print -quit 2>/dev/null || true)
        [ -n "$found" ] || die "libnvidia-ml.so.1 is neither in the ld.so cache nor in the usual places"
        dirname "$found" >"$work/ld.so.conf"
        ldconfig -C "$work/ld.so.cache" -f "$work/ld.so.conf"
        chmod a+r "$work/ld.so.cache"
        ldconfig="$(command -v ldconfig) -C $work/ld.so.cache -p"
        echo "note: the driver's libraries are not in the ld.so cache; the hook reads a cache of $(dirname "$found") (BERTH_LDCONFIG)"
    fi

    if ! id "$user" >/dev/null 2>&1; then
        useradd -m -s /bin/bash "$user"
        created=yes
    fi
    echo "== as an ordinary user ($user)"
    home=$(getent passwd "$user" | cut -d: -f6)
    data=$home/.local/share
    runner=(runuser -u "$user" --)
    who="an ordinary user"
    unpack_roots "$dir" "${runner[@]}" || die "$dir/rootfs.tar.gz: cannot unpack it as $user"
    if ! run_checks; then
        # Where ordinary users get no user namespace, root's view still
        # tells whether the hook works.
        echo "== as root"
        home=/root data=$work/root-data runner=() who=root
        unpack_roots "$dir"
        run_checks || true
    fi

    echo "gpu-check: $passed passed, $failures failed ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1))"
    [ "$failures" = 0 ]
}

case ${1:-} in
    prepare) [ $# = 2 ] || die "usage: $0 prepare DIR"; prepare "$2" ;;
    run) [ $# = 2 ] || die "usage: $0 run DIR"; run "$2" ;;
    *) die "usage: $0 prepare DIR | run DIR" ;;
esac
