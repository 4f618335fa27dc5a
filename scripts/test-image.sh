#!/usr/bin/env bash
# Build the MPI test image the scenarios run in containers, offline: Debian
# minbase of one suite (BERTH_NODE_SUITE: bookworm, the default, or trixie;
# from scripts/base-image.sh) + that suite's Open MPI + MPICH + the allreduce
# test program built against each, and an Open MPI ping-pong for bench/. Its
# /etc/os-release says VARIANT_ID=berth-mpi-test, so a test can tell the image
# from the host. /etc/profile.d puts /opt/mpi-test back on the PATH that
# Debian's /etc/profile sets, for the login shell a container starts through
# (ENROOT_LOGIN_SHELL). Writes, under .cache/images/SUITE/:
#   mpi-test.tar   docker-archive, for pushing to a registry with skopeo
#   mpi-test.sqsh  the same root as a squashfs, for --container-image=PATH.sqsh
#   mpi-test.sif   the same root as an Apptainer image, for --container-image=PATH.sif:
#                  with /.singularity.d (an environment script that puts
#                  /opt/mpi-test on PATH and sets MPI_TEST_IMAGE=sif, a
#                  runscript that runs allreduce-openmpi), made by siftool
# and, for both suites, .cache/images/realistic/ (see below).
# Skips the build when both exist and the sources are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${BERTH_NODE_SUITE:-bookworm}
case "$SUITE" in
    bookworm|trixie) ;;
    *) echo "test-image: BERTH_NODE_SUITE=$SUITE: not bookworm or trixie" >&2; exit 2 ;;
esac
IMAGE=berth/mpi-test:$SUITE
BASE=berth/node:$SUITE-minbase
OUT=.cache/images/$SUITE
SRC=molecule/multinode/files
stamp=$(cat "$0" "$SRC"/mpi_*.c | sha256sum | cut -c1-16)
env -u BERTH_NODE_IMAGE bash scripts/base-image.sh

# bench/realistic_image.py's production-shaped image, small, with a shell
# on top, as an OCI layout under .cache/images/realistic (one for both
# suites; made once): the clusters' store test pushes it
"${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin/python" - <<'PYTHON'
import sys
sys.path.insert(0, "bench")
import realistic_image
realistic_image.with_shell(realistic_image.cached(
    ".cache/images/realistic", quiet=True, **realistic_image.CLUSTER_TEST_SHAPE))
PYTHON

if [[ -f $OUT/mpi-test.sqsh && -f $OUT/mpi-test.tar && -f $OUT/mpi-test.sif &&
      "$(cat "$OUT/stamp" 2>/dev/null)" == "$stamp" ]]; then
    echo "test-image: $OUT/mpi-test.{tar,sqsh,sif} present"
    exit 0
fi
mkdir -p "$OUT"
work=$(mktemp -d /var/tmp/berth-test-image.XXXXXX)
trap 'rm -rf "$work"; docker rm -f berth-test-image-export >/dev/null 2>&1 || true' EXIT

cp "$SRC"/mpi_*.c "$work/"
cat >"$work/Dockerfile" <<DOCKERFILE
FROM $BASE
ENV DEBIAN_FRONTEND=noninteractive
COPY mpi_allreduce.c mpi_pingpong.c /opt/mpi-test/
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev mpich libmpich-dev gcc libc6-dev \
 && mpicc.openmpi -O2 -o /opt/mpi-test/allreduce-openmpi /opt/mpi-test/mpi_allreduce.c \
 && mpicc.mpich -O2 -o /opt/mpi-test/allreduce-mpich /opt/mpi-test/mpi_allreduce.c \
 && mpicc.openmpi -O2 -o /opt/mpi-test/pingpong-openmpi /opt/mpi-test/mpi_pingpong.c \
 && apt-get purge -y gcc libc6-dev libopenmpi-dev libmpich-dev && apt-get autoremove -y \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && printf 'VARIANT="Berth MPI test image"\nVARIANT_ID=berth-mpi-test\n' >> /usr/lib/os-release \
 && printf '%s\n' 'PATH="/opt/mpi-test:\$PATH"' > /etc/profile.d/mpi-test.sh
ENV PATH=/opt/mpi-test:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /opt/mpi-test
DOCKERFILE
echo "test-image: building $IMAGE (Debian $SUITE: Open MPI, MPICH)"
docker build -q -t "$IMAGE" "$work" >/dev/null

echo "test-image: writing $OUT/mpi-test.tar and $OUT/mpi-test.sqsh"
docker save -o "$work/mpi-test.tar" "$IMAGE"
docker create --name berth-test-image-export "$IMAGE" /bin/true >/dev/null
mkdir "$work/root"
docker export berth-test-image-export | tar -C "$work/root" -x --exclude='dev/*'
mksquashfs "$work/root" "$work/mpi-test.sqsh" -noappend -quiet -comp zstd >/dev/null
# The SIF: /.singularity.d appended to a copy of that squashfs, which siftool
# makes the primary system partition of a new SIF file.
echo "test-image: writing $OUT/mpi-test.sif"
mkdir -p "$work/apptainer/.singularity.d/env"
# shellcheck disable=SC2016  # the image's environment script: its shell expands $PATH
printf '%s\n' 'export PATH="/opt/mpi-test:$PATH"' 'export MPI_TEST_IMAGE=sif' \
    >"$work/apptainer/.singularity.d/env/90-environment.sh"
printf '%s\n' '#!/bin/sh' 'exec allreduce-openmpi "$@"' >"$work/apptainer/.singularity.d/runscript"
chmod 0755 "$work/apptainer/.singularity.d/runscript"
cp "$work/mpi-test.sqsh" "$work/apptainer.sqsh"
mksquashfs "$work/apptainer" "$work/apptainer.sqsh" -all-root -quiet -no-progress >/dev/null
declare -A SIF_ARCH=([amd64]=2 [arm64]=4 [ppc64el]=6 [s390x]=11 [riscv64]=12)
siftool new "$work/mpi-test.sif"
siftool add "$work/mpi-test.sif" "$work/apptainer.sqsh" --datatype 4 --parttype 2 --partfs 1 \
    --partarch "${SIF_ARCH[$(dpkg --print-architecture)]}"
chmod 0644 "$work/mpi-test.sqsh" "$work/mpi-test.tar" "$work/mpi-test.sif"
mv "$work/mpi-test.tar" "$work/mpi-test.sqsh" "$work/mpi-test.sif" "$OUT/"
echo "$stamp" >"$OUT/stamp"
