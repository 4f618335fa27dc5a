#!/usr/bin/env bash
# Bring up the local demo cluster (three Docker containers running systemd:
# berth-ctl, berth-cn1, berth-cn2) with site.yml, then run an MPI job across
# the two compute nodes as an ordinary user. `bash scripts/demo.sh destroy`
# removes the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap-host.sh
export PATH="${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin:$PATH"

if [[ "${1:-}" == "destroy" ]]; then
    exec molecule destroy -s multinode
fi

bash scripts/test-image.sh
molecule create -s multinode
molecule prepare -s multinode
molecule converge -s multinode

echo
echo "demo: srun -N2 -n2 --mpi=pmix mpi_allreduce, as user alice on berth-ctl"
docker exec berth-ctl runuser -u alice -- srun -N2 -n2 --mpi=pmix /opt/berth-test/mpi_allreduce
echo
echo "demo: the cluster is up; log in with: docker exec -it berth-ctl runuser -l alice"
