#!/usr/bin/env bash
# The whole test suite: lint, unit and integration tests, the runtime's suite
# and the SPANK plugin's build on Debian 13, and the multi-node Molecule
# scenario on Debian 12 and then on Debian 13 (one cluster at a time: two
# would fight over two cores). Exits non-zero on the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
stage() { printf '\n=== %s (at %d s)\n' "$*" $((SECONDS - started)); }

stage "host bootstrap (packages, Docker daemon, venv, node image)"
bash scripts/bootstrap-host.sh
export PATH="${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0

stage "ansible-lint (production profile)"
ansible-lint --profile production --offline
stage "syntax check"
ansible-playbook --syntax-check -i inventories/example/hosts.yml site.yml
ansible-playbook --syntax-check -i inventories/example/hosts.yml playbooks/upgrade.yml
stage "module documentation"
for module in library/*.py; do
    name=$(basename "$module" .py)
    ansible-doc -M library "$name" >/dev/null || { echo "ansible-doc fails for $name" >&2; exit 1; }
done

stage "test images (Open MPI, MPICH) of Debian 12 and 13: the runtime's dpkg test, the clusters"
BERTH_NODE_SUITE=bookworm bash scripts/test-image.sh
BERTH_NODE_SUITE=trixie bash scripts/test-image.sh

stage "unit and integration tests"
# Two workers, a test file to each at a time (tests/conftest.py starts the
# SPANK end-to-end file first): most tests wait on subprocesses, not the CPU.
python -m pytest -q -rs -n 2 --dist loadfile --no-loadscope-reorder --durations=10 \
    tests runtime/tests

stage "runtime suite on Debian 13 (Python 3.13), SPANK plugin against its Slurm 24.11"
bash scripts/test-runtime-suite.sh trixie

stage "multi-node cluster on Debian 12, Slurm 22.05 (molecule test -s multinode)"
BERTH_NODE_SUITE=bookworm molecule test -s multinode
stage "multi-node cluster on Debian 13, Slurm 24.11 (the same scenario and tests)"
BERTH_NODE_SUITE=trixie molecule test -s multinode
stage "done"
