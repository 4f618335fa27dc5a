"""The way back one node at a time (after test_berth.py, before
test_rollback.py rolls back the rest): playbooks/rollback.yml with --limit
gives one host pyxis and enroot back, and the cluster, half on each, runs
the site's jobs whichever plugin the login node or a compute node loads
(both register the same options under pyxis's name)."""


import pytest

from conftest import (
    COMPUTE,
    CONTROLLER,
    loads_pyxis,
    mpi_job_on_both,
    node,
    play,
    pyxis_started,
    srun,
)

BERTH_CN, PYXIS_CN = COMPUTE


@pytest.fixture(scope="module")
def compute_node_back():
    rc, output, recap = play("playbooks/rollback.yml", limit=PYXIS_CN)
    assert rc == 0, output
    assert set(recap) == {PYXIS_CN}, output
    assert loads_pyxis(PYXIS_CN) and not loads_pyxis(BERTH_CN) and not loads_pyxis(CONTROLLER)


@pytest.fixture(scope="module")
def login_node_back(compute_node_back):
    rc, output, recap = play("playbooks/rollback.yml", limit=CONTROLLER)
    assert rc == 0, output
    assert set(recap) == {CONTROLLER}, output
    assert loads_pyxis(CONTROLLER) and not loads_pyxis(BERTH_CN)


def test_a_berth_login_node_runs_a_job_across_a_pyxis_and_a_berth_node(compute_node_back):
    job_id = mpi_job_on_both()
    assert pyxis_started(PYXIS_CN, job_id) and not pyxis_started(BERTH_CN, job_id)
    assert node(PYXIS_CN).check_output("enroot version") == "4.1.2"


def test_a_pyxis_login_node_runs_berth_nodes_jobs(login_node_back):
    job_id = mpi_job_on_both()
    assert pyxis_started(PYXIS_CN, job_id) and not pyxis_started(BERTH_CN, job_id)
    job = srun(f"-w {BERTH_CN} --container-name=keep ls /kept")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["/kept"]
