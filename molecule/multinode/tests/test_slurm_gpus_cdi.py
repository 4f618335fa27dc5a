"""Slurm's GPU binding through NVIDIA's CDI spec, on both compute nodes.

The GPUs are MOCKED: this bed has none. Each compute node gets two
fabricated NVIDIA GPUs, as the driver shows them and as NVIDIA's tools
describe them:
  - the driver's procfs tree (/proc/driver/nvidia/gpus/BUS/information, in
    its format), on a tmpfs over /proc/driver, which the role's
    berth_hardware_facts and the nvidia hook read;
  - device nodes /dev/nvidia0 and /dev/nvidia1, made with mknod, with the
    numbers of /dev/full and /dev/net/tun: the node's own device cgroup
    (Docker's) lets Slurm's ConstrainDevices grant a step only what it
    allows, and no task here opens those two;
  - a CDI spec of kind nvidia.com/gpu in /etc/cdi (devices 0, 1 and all),
    as `nvidia-ctk cdi generate` writes one, whose devices bind those nodes
    at /opt/hgpu/nvidiaN (the node's /dev is the container's, where an
    unprivileged start cannot make a file to bind on) and set HGPU_GPUN.
Slurm learns of them through the role's own path: the Slurm layer's
berth_hardware_facts find the GPUs, and the role writes
gres.conf and slurm.conf's Gres= (a day-2 change of site.yml's Slurm layer;
the fixture takes it all away again and reruns the layer). The hook's own discovery would bind
/dev/nvidiaN and the driver's libraries, and fails on these nodes for want
of /dev/nvidiactl: where a task gets the spec's devices, the spec won.
"""

import json
import shlex
import time

import pytest

from conftest import COMPUTE, CONTROLLER, SLURM_PLAY, inventory_copy, node, per_rank, play

SPEC_DIR = "/etc/cdi"
SPEC = f"{SPEC_DIR}/hgpu-nvidia.json"
GPUS = 2
# each GPU's device numbers (major, minor), and as stat's %t:%T shows them
NUMBERS = [(1, 7), (10, 200)]
SHOWN = [f"{major:x}:{minor:x}" for major, minor in NUMBERS]
SHOW = ("sh -c 'echo \"$HGPU_SPEC $CUDA_VISIBLE_DEVICES\"; ls /opt/hgpu; "
        "env | grep ^HGPU_GPU | sort; stat -c %t:%T /opt/hgpu/*; "
        "test ! -e /usr/local/nvidia/lib64 || echo the-hooks-own-binding'")


def _uuid(rank, gpu):
    return f"GPU-{rank:08x}-0000-4000-8000-{gpu:012x}"


def _information(rank, gpu):
    return (f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {_uuid(rank, gpu)}\n"
            f"Bus Location: \t 0000:1{gpu}:00.0\nDevice Minor: \t {gpu}\n")


def _device(gpu, name):
    return {"env": [f"HGPU_GPU{gpu}=of-{name}"],
            "deviceNodes": [{"path": f"/opt/hgpu/nvidia{gpu}", "hostPath": f"/dev/nvidia{gpu}"}]}


def _spec(name):
    """NVIDIA's spec's shape: a device per index and `all`; the spec's own
    edits name the node."""
    devices = [{"name": str(gpu), "containerEdits": _device(gpu, name)} for gpu in range(GPUS)]
    every = [_device(gpu, name) for gpu in range(GPUS)]
    devices.append({"name": "all", "containerEdits": {
        "env": [e for d in every for e in d["env"]],
        "deviceNodes": [n for d in every for n in d["deviceNodes"]]}})
    return json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                       "containerEdits": {"env": [f"HGPU_SPEC=of-{name}"]}, "devices": devices})


def install_spec(name):
    node(name).check_output(
        f"install -d -m 0755 {SPEC_DIR} && printf '%s\\n' {shlex.quote(_spec(name))} > {SPEC} "
        f"&& chmod 0644 {SPEC}")


def remove_spec(name):
    node(name).run(f"rm -f {SPEC}; rmdir {SPEC_DIR} 2>/dev/null || true")


def fabricate(rank, name):
    steps = ["mount -t tmpfs -o mode=0755,size=1m berth-test-gpus /proc/driver"]
    for gpu in range(GPUS):
        where = f"/proc/driver/nvidia/gpus/0000:1{gpu}:00.0"
        steps += [f"mkdir -p {where}",
                  f"printf '%b' {shlex.quote(_information(rank, gpu))} > {where}/information",
                  f"rm -f /dev/nvidia{gpu}",
                  f"mknod -m 0666 /dev/nvidia{gpu} c {NUMBERS[gpu][0]} {NUMBERS[gpu][1]}"]
    node(name).check_output(" && ".join(steps))
    install_spec(name)


def unfabricate(name):
    node(name).run(f"umount /proc/driver; rm -f /dev/nvidia0 /dev/nvidia1; rm -f {SPEC}; "
                   f"rmdir {SPEC_DIR} 2>/dev/null || true")


@pytest.fixture(scope="module")
def gpus(tmp_path_factory):
    inventory = inventory_copy(tmp_path_factory.mktemp("gpus"))
    try:
        for rank, name in enumerate(COMPUTE):
            fabricate(rank, name)
        rc, output, _ = play(inventory, playbook=SLURM_PLAY)
        assert rc == 0, output[-3000:]
        yield
    finally:
        for name in COMPUTE:
            unfabricate(name)
        rc, output, _ = play(inventory, playbook=SLURM_PLAY)
        assert rc == 0, output[-3000:]
        assert "Name=gpu" not in node(CONTROLLER).file("/etc/slurm/gres.conf").content_string


def srun(args):
    """srun as alice, refused where its nodes cannot be had within 2 min
    (a node Slurm drained for its GPUs would keep it pending for ever)."""
    return node(CONTROLLER).run(f"cd /tmp && runuser -u alice -- srun --immediate=120 {args}")


def expected(gpus, visible):
    """Each rank's lines when the step was bound `gpus` (host indices) of
    its node, seen inside as CUDA devices `visible`."""
    return {rank: [f"of-{name} {visible}", *(f"nvidia{g}" for g in gpus),
                   *(f"HGPU_GPU{g}=of-{name}" for g in gpus), *(SHOWN[g] for g in gpus)]
            for rank, name in enumerate(COMPUTE)}


def test_slurm_knows_the_nodes_gpus_from_the_roles_facts(gpus):
    conf = node(CONTROLLER).file("/etc/slurm/gres.conf").content_string
    for name in COMPUTE:
        assert f"NodeName={name} Name=gpu Type=h100 File=/dev/nvidia[0-1]" in conf, conf
        shown = node(CONTROLLER).check_output(f"scontrol show node {name}")
        assert "Gres=gpu:h100:2" in shown, shown


def test_one_gpu_per_node_is_the_specs_device_slurm_bound_and_not_the_other(gpus):
    job = srun(f"-N2 --ntasks-per-node=1 -l --gres=gpu:1 --container-image="
               f"/opt/berth-images/mpi-test.sqsh {SHOW}")
    assert job.rc == 0, job.stdout + job.stderr
    assert per_rank(job) == expected([0], "0"), job.stdout


def test_two_gpus_per_node_are_both_the_specs_devices(gpus):
    job = srun(f"-N2 --ntasks-per-node=1 -l --gres=gpu:2 --container-image="
               f"/opt/berth-images/mpi-test.sqsh {SHOW}")
    assert job.rc == 0, job.stdout + job.stderr
    assert per_rank(job) == expected([0, 1], "0,1"), job.stdout


def test_the_second_gpu_alone_while_another_job_holds_the_first(gpus):
    holder = node(CONTROLLER).check_output(
        "cd /tmp && runuser -u alice -- sbatch --parsable -N2 --ntasks-per-node=1 --gres=gpu:1 "
        "-o /dev/null --wrap 'srun sleep 300'")
    try:
        for _ in range(60):
            if node(CONTROLLER).check_output(f"squeue -h -j {holder} -o %T") == "RUNNING":
                break
            time.sleep(1)
        job = srun(f"-N2 --ntasks-per-node=1 -l --gres=gpu:1 --container-image="
                   f"/opt/berth-images/mpi-test.sqsh {SHOW}")
    finally:
        node(CONTROLLER).run(f"scancel {holder}")
    assert job.rc == 0, job.stdout + job.stderr
    # GPU 1 of each node, the first CUDA device inside
    assert per_rank(job) == expected([1], "0"), job.stdout


def test_without_the_spec_the_hooks_own_discovery_runs_and_finds_no_driver(gpus):
    """The control: the same step with no spec on the nodes is the hook's
    discovery's, which these mocked GPUs do not satisfy."""
    for name in COMPUTE:
        remove_spec(name)
    try:
        job = srun("-N2 --ntasks-per-node=1 --gres=gpu:1 "
                   "--container-image=/opt/berth-images/mpi-test.sqsh true")
    finally:
        for name in COMPUTE:
            install_spec(name)
    assert job.rc != 0
    assert "/dev/nvidiactl: missing (is the nvidia driver loaded?)" in job.stderr, job.stderr
