"""The converged three-node cluster: daemons, files, and an MPI job across nodes."""

import hashlib
import re

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, node


@pytest.mark.parametrize("name", NODES)
def test_munge_runs_with_one_shared_key(name):
    host = node(name)
    assert host.service("munge").is_running
    assert host.service("munge").is_enabled
    key = host.file("/etc/munge/munge.key")
    assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400)
    assert key.size >= 32


def test_munge_key_is_the_same_everywhere():
    digests = {
        name: hashlib.sha256(node(name).file("/etc/munge/munge.key").content).hexdigest()
        for name in NODES
    }
    assert len(set(digests.values())) == 1, digests


def test_munge_credentials_cross_nodes():
    credential = node(CONTROLLER).check_output("munge -n")
    for name in COMPUTE:
        decoded = node(name).run(f"echo '{credential}' | unmunge")
        assert decoded.rc == 0, decoded.stderr
        assert "STATUS:          Success" in decoded.stdout


def test_slurmctld_runs_on_the_controller_only():
    assert node(CONTROLLER).service("slurmctld").is_running
    assert node(CONTROLLER).service("slurmctld").is_enabled
    for name in COMPUTE:
        assert not node(name).service("slurmctld").is_running


@pytest.mark.parametrize("name", COMPUTE)
def test_slurmd_runs_on_compute_nodes(name):
    assert node(name).service("slurmd").is_running
    assert node(name).service("slurmd").is_enabled


@pytest.mark.parametrize("name", NODES)
def test_slurm_conf_is_generated_from_inventory_and_facts(name):
    host = node(name)
    conf = host.file("/etc/slurm/slurm.conf")
    assert (conf.user, conf.mode) == ("root", 0o644)
    text = conf.content_string
    assert "Ansible managed" in text
    assert "MpiDefault=pmix" in text
    assert "SlurmctldHost=berth-ctl" in text
    cpus = node(COMPUTE[0]).check_output("nproc")
    for compute in COMPUTE:
        assert re.search(rf"^NodeName={compute} CPUs={cpus} .*RealMemory=\d+", text, re.M)
    plugstack = host.file("/etc/slurm/plugstack.conf").content_string
    assert "include /etc/slurm/plugstack.conf.d/*.conf" in plugstack
    assert host.file("/etc/slurm/plugstack.conf.d").is_directory


def test_state_directory_belongs_to_slurm():
    state = node(CONTROLLER).file("/var/lib/slurm/slurmctld")
    assert state.is_directory and state.user == "slurm" and state.mode == 0o755


def test_both_compute_nodes_are_idle():
    states = node(CONTROLLER).check_output("sinfo -h -N -o '%N %t'")
    assert sorted(states.splitlines()) == [f"{c} idle" for c in COMPUTE]


def test_pmix_is_offered():
    assert "pmix" in node(CONTROLLER).check_output("srun --mpi=list 2>&1")


def test_mpi_allreduce_across_two_nodes_as_a_user():
    job = node(CONTROLLER).run(
        "runuser -u alice -- srun -N2 -n2 --mpi=pmix /opt/berth-test/mpi_allreduce"
    )
    assert job.rc == 0, job.stderr
    ranks = re.findall(r"^rank (\d) of 2 on (\S+)$", job.stdout, re.M)
    assert sorted(ranks) == [("0", COMPUTE[0]), ("1", COMPUTE[1])]
    assert "allreduce sum 3" in job.stdout
