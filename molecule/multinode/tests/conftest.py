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
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).parents[3]))


@functools.cache
def node(name):
    """A node by its container name, through docker exec (fast, no ssh)."""
    return testinfra.get_host(f"docker://{name}")


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
    """Run site.yml, or one of its layers (`playbook`, e.g. playbooks/containers.yml:
    a minute less than the whole where the test's subject is one role);
    return (exit code, output, {host: changed count})."""
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), playbook, *args],
        cwd=PROJECT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"},
    )
    output = result.stdout + result.stderr
    recap = {
        host: int(changed)
        for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)
    }
    return result.returncode, output, recap
