#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine (as root) to run Berth's demo and tests:
# Debian packages, the Docker daemon, the Python dev venv, the node image.
# Callers use the venv's bin: ${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin.
# Idempotent: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    docker.io iproute2 iptables debootstrap skopeo docker-registry apache2-utils
    squashfs-tools squashfuse fuse-overlayfs uidmap zstd pigz isal busybox-static siftool dropbear-bin
    python3-venv python3-requests python3-tqdm python3-yaml python3-setuptools python3-wheel
    gcc make libc6-dev valgrind libslurm-dev slurm-wlm-basic-plugins-dev slurm-client
    shellcheck
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

bash scripts/start-dockerd.sh

# The venv lives outside the checkout, world-readable, so tests can run the
# runtime as an ordinary user, and later clones on this machine reuse it.
VENV=${BERTH_DEV_VENV:-/opt/berth-dev/venv}
if [[ ! -x "$VENV/bin/molecule" ]] || ! cmp -s requirements-dev.txt "$VENV/requirements-dev.txt"; then
    echo "bootstrap: creating $VENV from Debian's python3"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-dev.txt
    cp requirements-dev.txt "$VENV/requirements-dev.txt"
fi
# This checkout's runtime, editable (quick; points the venv at this clone).
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e runtime

bash scripts/base-image.sh
