"""Helpers for molecule/adopt's verify step: the nodes, jobs as the test user,
the site's marks and file lists, and ansible-playbook runs against
Molecule's inventory from the project root (so ansible.cfg applies)."""

import functools
import os
import re
import subprocess
import time
from pathlib import Path

import testinfra

CONTROLLER = "berth-adopt-ctl"
COMPUTE = ["berth-adopt-cn1", "berth-adopt-cn2"]
NODES = [CONTROLLER, *COMPUTE]
IMAGE = "/opt/berth-images/mpi-test.sqsh"
# the same image in the site's registry on the controller (prepare.yml)
REGISTRY_IMAGE = "berth-adopt-ctl:5000#berth/mpi-test:1"
OPENMPI = "/opt/mpi-test/allreduce-openmpi"
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).parents[3]))


@functools.cache
def node(name):
    """A node by its container name, through docker exec."""
    return testinfra.get_host(f"docker://{name}")


def srun(args):
    """srun on the login node (the controller) as the test user; the output
    parsed is the job's, so chdir where alice may."""
    return node(CONTROLLER).run(f"cd /tmp && runuser -u alice -- srun {args}")


def job_id(job):
    """The one job id a job's tasks printed (`printenv SLURM_JOB_ID`)."""
    assert job.rc == 0, job.stdout + job.stderr
    ids = set(job.stdout.split())
    assert len(ids) == 1, job.stdout
    return ids.pop()


def marks(job_id, nodes, *, wait_s=30):
    """The site's prolog and epilog marks of one job, {(script, node)}, once
    both scripts marked every one of `nodes` (the epilogs run after srun
    returns, each node's on its own time) or after `wait_s`."""
    expected = {(script, name) for script in ("prolog", "epilog") for name in nodes}
    deadline = time.monotonic() + wait_s
    while True:
        found = {
            tuple(name.split(".")[::2])
            for name in node(CONTROLLER).check_output("ls /shared/marks").split()
            if name.split(".")[1] == job_id
        }
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(1)


def site_files(name):
    """files/site-files.sh's list of the node now."""
    return node(name).check_output("/opt/site-check/site-files.sh").splitlines()


def site_files_before(name):
    """The same list, as prepare.yml recorded it before the move."""
    return node(CONTROLLER).file(f"/shared/before/{name}.txt").content_string.splitlines()


def play(playbook, *, limit=None):
    """Run one playbook against Molecule's inventory, on the `limit` hosts
    only if given; (exit code, output, {host: changed})."""
    result = subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], playbook,
         *(["--limit", limit] if limit else [])],
        cwd=PROJECT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"},
    )
    output = result.stdout + result.stderr
    recap = {
        host: int(changed)
        for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)
    }
    return result.returncode, output, recap


def site_tag_job(tag):
    """A --container-image step on both compute nodes with the site's own
    SPANK plugin's --site-tag (files/site_tag.c); each task's lines, sorted."""
    job = srun(f"-N2 --site-tag={tag} --container-image={IMAGE} "
               "sh -c 'echo \"SITE_TAG=$SITE_TAG\"; grep ^VARIANT_ID= /etc/os-release'")
    assert job.rc == 0, job.stdout + job.stderr
    return sorted(job.stdout.splitlines())


def site_tag_lines(tag):
    """What site_tag_job prints when the tag reaches the containerized tasks."""
    return sorted([f"SITE_TAG={tag}", "VARIANT_ID=berth-mpi-test"] * 2)


def mpi_job_on_both():
    """An Open MPI job across both compute nodes; its id."""
    job = srun(f"-N2 -n2 --mpi=pmix --container-image={IMAGE} "
               f"sh -c 'echo job $SLURM_JOB_ID; exec {OPENMPI}'")
    assert job.rc == 0, job.stdout + job.stderr
    ranks = re.findall(r"^rank (\d+) of 2 on (\S+)$", job.stdout, re.M)
    assert sorted(rank for rank, _ in ranks) == ["0", "1"], job.stdout
    assert {host for _, host in ranks} == set(COMPUTE)
    assert "allreduce sum 3" in job.stdout
    ids = set(re.findall(r"^job (\d+)$", job.stdout, re.M))
    assert len(ids) == 1, job.stdout
    return ids.pop()


def loads_pyxis(name):
    """Whether the node's Slurm loads pyxis (its plugstack line in place)."""
    return node(name).file("/etc/slurm/plugstack.conf.d/pyxis.conf").exists


def pyxis_started(name, job_id):
    """Whether pyxis started a container for the job's step on the node."""
    log = node(name).file("/var/log/slurm/slurmd.log").content_string
    return f"[{job_id}.0] pyxis: starting container" in log
