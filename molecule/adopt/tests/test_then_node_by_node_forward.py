"""The move in docs/admin/from-pyxis.md's install order (after
test_rollback.py has given every node pyxis and enroot back): site.yml
with --limit on the login node and controller, then on one compute node,
then on the other, the cluster running an MPI job across both compute
nodes at each step; then site.yml on the whole cluster changes nothing."""

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, loads_pyxis, mpi_job_on_both, play, pyxis_started

FIRST_CN, LAST_CN = COMPUTE


def moved(limit):
    """site.yml on the `limit` hosts alone; the hosts it ran on."""
    rc, output, recap = play("site.yml", limit=limit)
    assert rc == 0, output[-3000:]
    return set(recap) - {"localhost"}


@pytest.fixture(scope="module")
def login_node_moved():
    assert moved("slurm_controller:slurm_login") == {CONTROLLER}
    assert not loads_pyxis(CONTROLLER) and all(loads_pyxis(name) for name in COMPUTE)


@pytest.fixture(scope="module")
def first_compute_node_moved(login_node_moved):
    assert moved(FIRST_CN) == {FIRST_CN}
    assert not loads_pyxis(FIRST_CN) and loads_pyxis(LAST_CN)


@pytest.fixture(scope="module")
def every_node_moved(first_compute_node_moved):
    assert moved(LAST_CN) == {LAST_CN}
    assert not any(loads_pyxis(name) for name in NODES)


def test_a_berth_login_node_runs_a_job_on_pyxis_nodes(login_node_moved):
    job_id = mpi_job_on_both()
    assert all(pyxis_started(name, job_id) for name in COMPUTE)


def test_a_job_runs_across_a_moved_and_a_pyxis_compute_node(first_compute_node_moved):
    job_id = mpi_job_on_both()
    assert pyxis_started(LAST_CN, job_id) and not pyxis_started(FIRST_CN, job_id)


def test_once_every_node_moved_berth_runs_every_step_and_site_yml_changes_nothing(every_node_moved):
    job_id = mpi_job_on_both()
    assert not any(pyxis_started(name, job_id) for name in COMPUTE)
    rc, output, recap = play("site.yml")
    assert rc == 0, output[-3000:]
    assert set(recap) >= set(NODES) and not any(recap.values()), recap
