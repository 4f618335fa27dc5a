#!/usr/bin/env bash
# The runtime's whole suite (runtime/tests) on one Debian suite's own python3,
# inside a container of that suite's node image, after the SPANK plugin's
# build and option tests (make -C spank all check) against that suite's
# Slurm headers:
#   scripts/test-runtime-suite.sh trixie     Debian 13, Python 3.13, Slurm 24.11
#   scripts/test-runtime-suite.sh bookworm   Debian 12, Python 3.11, Slurm 22.05
# Further arguments go to pytest in place of runtime/tests (e.g.
# runtime/tests/test_edf.py -x); it runs two workers, a test file to each
# (Python 3.13 warns of any fork beside the workers' threads: the tests that
# fork do so on purpose, and exec or exit in the child).
# The host's venv is not used: pytest, hypothesis, requests, tqdm, the tools
# the tests call and the plugin's compiler and headers are the suite's own
# Debian packages, installed once into berth/node:SUITE-tests (rebuilt when
# the list below or the node image changes; the node image comes from
# scripts/base-image.sh when missing). The checkout's runtime/, hooks/,
# spank/, bench/, the GPU fixtures (tests/fixtures/gpu) and pytest.ini (the
# test marks' names) are copied in, so nothing is written into the
# checkout; the MPI test image
# (.cache/images/bookworm/mpi-test.sqsh, from scripts/test-image.sh) is bound
# read-only when present: the dpkg test starts it. One module comes
# from the host's venv: berth build's parser (the build extra of
# runtime/pyproject.toml, in no Debian suite), one abi3 file for every
# Python 3, copied in as /src/pylib/dockerfile.abi3.so, and its ignore
# files' matcher, a pure-Python package copied in as
# /src/pylib/e2b_dockerfile_utils.
# The container runs the tests as root, as close to the host as they expect,
# without --privileged (it fails on the development machines; set
# BERTH_PRIVILEGED=true where it works): every capability but SYS_RESOURCE,
# no seccomp or AppArmor profile, /proc and /sys unmasked (a new pid
# namespace may mount its own /proc only when no path of the outer one is
# masked), a device cgroup of "a *:* rwm" as the host's root cgroup has (the
# devices hook adds what an explicit rule grants), the host's cgroup tree
# read-only at the path /proc/self/cgroup names, and pytest below an init,
# not as pid 1.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${1:-}
case "$SUITE" in
    bookworm|trixie) shift ;;
    *) echo "usage: $0 bookworm|trixie [PYTEST ARGS...]" >&2; exit 2 ;;
esac
NODE=berth/node:$SUITE
IMAGE=berth/node:$SUITE-tests
# a name per run: two runs at once (two suites, or two clones) never meet
NAME=berth-$SUITE-runtime-suite-$$
PACKAGES=(
    python3-pytest python3-pytest-xdist python3-hypothesis python3-requests python3-tqdm python3-yaml
    squashfs-tools squashfuse fuse-overlayfs uidmap zstd pigz busybox-static siftool
    docker-registry skopeo openssl tzdata
    gcc make libc6-dev libslurm-dev
)

# BERTH_NODE_IMAGE names the Molecule scenario's image: not the one wanted here.
env -u BERTH_NODE_IMAGE BERTH_NODE_SUITE="$SUITE" bash scripts/base-image.sh
stamp=$({ docker image inspect -f '{{.Id}}' "$NODE"; printf '%s\n' "${PACKAGES[@]}"; } \
        | sha256sum | cut -c1-16)
if [[ "$(docker image inspect -f '{{index .Config.Labels "berth.tests"}}' "$IMAGE" 2>/dev/null)" \
      != "$stamp" ]]; then
    echo "runtime-suite: building $IMAGE (the tests' Debian packages)"
    printf '%s\n' "FROM $NODE" "LABEL berth.tests=$stamp" \
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
--no-install-recommends ${PACKAGES[*]} >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*" \
        | docker build -q -t "$IMAGE" - >/dev/null
fi

if [[ "${BERTH_PRIVILEGED:-false}" == true ]]; then
    access=(--privileged)
else
    access=(--cap-add ALL --cap-drop SYS_RESOURCE --security-opt systempaths=unconfined
            --device /dev/fuse --device /dev/loop-control --device-cgroup-rule 'a *:* rwm')
fi
mounts=()
debian_image=.cache/images/bookworm/mpi-test.sqsh
if [[ -f $debian_image ]]; then
    mounts=(-v "$PWD/$debian_image:/src/$debian_image:ro")
fi

docker rm -f "$NAME" >/dev/null 2>&1 || true
trap 'docker rm -f "$NAME" >/dev/null 2>&1 || true' EXIT
# /tmp (pytest's tmp_path) is a tmpfs: overlayfs does not mount on the
# container's own overlay root.
parser=$("${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin/python3" -c \
         'import dockerfile; print(dockerfile.__file__)')
matcher=$("${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin/python3" -c \
          'import os, e2b_dockerfile_utils as m; print(os.path.dirname(m.__file__))')
tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache \
        --exclude=.hypothesis pytest.ini runtime hooks spank bench tests/fixtures/gpu \
        -C "$(dirname "$parser")" --transform 's,^dockerfile,pylib/dockerfile,' \
        --transform 's,^e2b_dockerfile_utils,pylib/e2b_dockerfile_utils,' \
        "$(basename "$parser")" "$(basename "$matcher")" \
    | docker run -i --rm --init --name "$NAME" "${access[@]}" \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:ro \
        --tmpfs /tmp:exec,mode=1777 "${mounts[@]}" -e PYTHONPATH=/src/runtime:/src/pylib \
        -w /src "$IMAGE" \
        sh -c '. /etc/os-release && tar -x &&
               echo "runtime-suite: SPANK plugin, $PRETTY_NAME, Slurm $(dpkg-query -W \
                     -f "\${Version}" libslurm-dev)" &&
               make -s --no-print-directory -C spank O=/tmp/spank all check &&
               echo "runtime-suite: runtime/tests, $PRETTY_NAME, $(python3 -V)" &&
               exec python3 -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile \
                   -W "ignore:This process:DeprecationWarning" "$@"' \
        sh "${@:-runtime/tests}"
