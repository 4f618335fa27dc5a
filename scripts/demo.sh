#!/usr/bin/env bash
# Bring up the local demo cluster (three Docker containers running systemd:
# berth-ctl, berth-cn1, berth-cn2) with site.yml, then run an MPI job across
# the two compute nodes as an ordinary user, each rank inside a container of
# an image from the cluster's registry. `bash scripts/demo.sh destroy`
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

job=(srun -N2 -n4 --mpi=pmix --container-image=berth-ctl:5000#berth/mpi-test:1 allreduce-openmpi)
echo
echo "demo: as user alice on berth-ctl: ${job[*]}"
docker exec berth-ctl runuser -u alice -- "${job[@]}"
echo
echo "demo: the cluster is up; log in with: docker exec -it berth-ctl runuser -l alice"
