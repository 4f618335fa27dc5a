"""Helpers for the multinode verify step: the nodes, and ansible-playbook runs
against Molecule's inventory from the project root (so ansible.cfg applies)."""

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import testinfra

CONTROLLER = "berth-ctl"
COMPUTE = ["berth-cn1", "berth-cn2"]
NODES = [CONTROLLER, *COMPUTE]
# site.yml's layer of the runtime role (enroot.conf, the store, pre-staging, prune timers)
RUNTIME_PLAY = "playbooks/containers.yml"
# site.yml's layer of the slurm role (slurm.conf and its daemons)
SLURM_PLAY = "playbooks/slurm.yml"
# site.yml's layer of the spank_plugin role (the plugin built on every Slurm host)
SPANK_PLAY = "playbooks/spank.yml"
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).parents[3]))


@functools.cache
def node(name):
    """A node by its container name, through docker exec (fast, no ssh)."""
    return testinfra.get_host(f"docker://{name}")


def per_rank(job):
    """{rank: its lines} of an `srun -l` job's output."""
    lines = {}
    for line in job.stdout.splitlines():
        rank, _, text = line.partition(": ")
        lines.setdefault(int(rank), []).append(text)
    return lines


def job_ids():
    """The ids of the jobs slurmctld knows now. A refused submission adds none;
    finished jobs may drop out meanwhile (MinJobAge), so compare sets, not counts."""
    return set(node(CONTROLLER).check_output("squeue -h -a -t all -o %i").split())


def inventory_copy(tmp_path):
    """A private copy of Molecule's inventory directory that a test may edit."""
    source = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    target = tmp_path / "inventory"
    shutil.copytree(source, target, symlinks=False)
    return target


def play(inventory, *args, playbook="site.yml"):
    """Run site.yml, or the layers of it that the test is about (`playbook`:
    one, e.g. RUNTIME_PLAY, or a list run in one ansible-playbook call; a
    no-change site.yml takes 80-110 s on the test bed, its runtime layer a
    third of that); return (exit code, output, {host: changed count})."""
    playbooks = [playbook] if isinstance(playbook, str) else list(playbook)
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), *playbooks, *args],
        cwd=PROJECT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"},
    )
    output = result.stdout + result.stderr
    recap = {
        host: int(changed)
        for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)
    }
    return result.returncode, output, recap
