"""The move one node at a time (after test_rollback.py has given every node
pyxis and enroot back), as docs/admin/from-pyxis.md's install order has it:
site.yml with --limit moves one compute node while the login node and the
other stay on pyxis, and the cluster, half on each, runs MPI jobs across
both halves; then the rest move, and Berth runs every step."""

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, loads_pyxis, mpi_job_on_both, play, pyxis_started

MOVED_CN, PYXIS_CN = COMPUTE


@pytest.fixture(scope="module")
def one_compute_node_moved():
    rc, output, recap = play("site.yml", limit=MOVED_CN)
    assert rc == 0, output[-3000:]
    assert set(recap) - {"localhost"} == {MOVED_CN}, output[-3000:]
    assert not loads_pyxis(MOVED_CN) and loads_pyxis(PYXIS_CN) and loads_pyxis(CONTROLLER)


@pytest.fixture(scope="module")
def every_node_moved(one_compute_node_moved):
    rc, output, recap = play("site.yml", limit=f"{CONTROLLER},{PYXIS_CN}")
    assert rc == 0, output[-3000:]
    assert set(recap) - {"localhost"} == {CONTROLLER, PYXIS_CN}, output[-3000:]
    assert not any(loads_pyxis(name) for name in NODES)


def test_a_pyxis_login_node_runs_a_job_across_a_moved_and_a_pyxis_node(one_compute_node_moved):
    job_id = mpi_job_on_both()
    assert pyxis_started(PYXIS_CN, job_id) and not pyxis_started(MOVED_CN, job_id)


def test_once_every_node_moved_berth_runs_every_step(every_node_moved):
    job_id = mpi_job_on_both()
    assert not any(pyxis_started(name, job_id) for name in COMPUTE)
