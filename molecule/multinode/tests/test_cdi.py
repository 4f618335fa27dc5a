"""CDI devices through Slurm on the deployed cluster: `--container-device`
and an EDF's `devices`, resolved by each compute node's own specs.

No vendor's device is here: the test installs on both compute nodes a spec
of a made-up vendor (kind example.com/dev, device `x`) whose device node is
a character device made with mknod (the numbers of /dev/null, so opening it
is harmless) in a root-owned directory of the test's, and removes both at
the end. The device's path in the container is outside /dev: the node's
/dev is the container's, where an unprivileged start cannot make the file
to bind on.
"""

import json
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, node, per_rank

IMAGE = "/opt/berth-images/mpi-test.sqsh"
KIND = "example.com/dev"
SPEC_DIR = "/etc/cdi"  # a directory of the runtime's default BERTH_CDI_SPEC_DIRS
SPEC = f"{SPEC_DIR}/hcdi-example.json"
STAND_IN = "/opt/hcdi-dev"
SHOW = "sh -c 'echo \"$HCDI_DEVICE\"; stat -c \"%F %t:%T\" /opt/hcdi-device-x'"


def spec_for(name):
    """The spec on compute node `name`: its env names the node, so each
    task's line says whose spec it got."""
    return json.dumps({
        "cdiVersion": "0.6.0", "kind": KIND,
        "devices": [{"name": "x", "containerEdits": {
            "env": [f"HCDI_DEVICE=x-of-{name}"],
            "deviceNodes": [{"path": "/opt/hcdi-device-x", "hostPath": f"{STAND_IN}/x"}]}}],
    })


def install(name):
    node(name).run(
        f"install -d -m 0755 {SPEC_DIR} {STAND_IN} && rm -f {STAND_IN}/x && "
        f"mknod -m 0666 {STAND_IN}/x c 1 3 && "
        f"printf '%s\\n' {shlex.quote(spec_for(name))} > {SPEC} && chmod 0644 {SPEC}")


def remove(name):
    node(name).run(f"rm -rf {SPEC} {STAND_IN}; rmdir {SPEC_DIR} 2>/dev/null || true")


@pytest.fixture
def device():
    for name in COMPUTE:
        install(name)
    yield f"{KIND}=x"
    for name in COMPUTE:
        remove(name)
    node(CONTROLLER).run("rm -f /home/alice/.edf/cditest.toml")


def srun(args):
    return node(CONTROLLER).run(f"cd /home/alice && runuser -u alice -- srun {args}")


def assert_both_nodes_see_it(job):
    assert job.rc == 0, job.stdout + job.stderr
    assert per_rank(job) == {
        rank: [f"x-of-{name}", "character special file 1:3"]
        for rank, name in enumerate(COMPUTE)}, job.stdout


def test_container_device_reaches_the_tasks_on_both_nodes(device):
    job = srun(f"-N2 --ntasks-per-node=1 -l --container-image={IMAGE} "
               f"--container-device={device} {SHOW}")
    assert_both_nodes_see_it(job)


def test_an_edfs_devices_reach_the_tasks_on_both_nodes(device):
    edf = f'image = "{IMAGE}"\ndevices = ["{device}"]\n'
    node(CONTROLLER).run(
        f"install -d -o alice /home/alice/.edf && printf '%s' {shlex.quote(edf)} "
        "> /home/alice/.edf/cditest.toml && chown alice /home/alice/.edf/cditest.toml")
    job = srun(f"-N2 --ntasks-per-node=1 -l --environment=cditest {SHOW}")
    assert_both_nodes_see_it(job)


def test_a_node_without_the_spec_fails_the_step_naming_the_device(device):
    remove(COMPUTE[1])
    job = srun(f"-N2 --ntasks-per-node=1 --container-image={IMAGE} "
               f"--container-device={device} true")
    assert job.rc != 0
    assert f"--device {device}: no CDI spec on this node has it" in job.stderr, job.stderr
