"""The way back (playbooks/rollback.yml, after test_berth.py): every file the
move set aside or changed is byte for byte as prepare.yml recorded it, and
real pyxis and enroot run the site's jobs again."""

import pytest

from conftest import (
    COMPUTE,
    IMAGE,
    NODES,
    REGISTRY_IMAGE,
    node,
    play,
    site_files,
    site_files_before,
    site_tag_job,
    site_tag_lines,
    srun,
)


@pytest.fixture(scope="module", autouse=True)
def rolled_back():
    rc, output, recap = play("playbooks/rollback.yml")
    assert rc == 0, output
    assert set(recap) == set(NODES), output
    return recap


@pytest.mark.parametrize("name", NODES)
def test_every_file_is_as_the_site_had_it(name):
    assert site_files(name) == site_files_before(name)


def test_pyxis_and_enroot_run_a_container_image_again():
    job = srun(f"-N2 --container-image={IMAGE} grep ^VARIANT_ID= /etc/os-release")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["VARIANT_ID=berth-mpi-test"] * 2
    for name in COMPUTE:
        assert node(name).check_output("enroot version") == "4.1.2"


def test_pyxis_runs_the_registry_image_from_the_cache_both_filled():
    job = srun(f"-w {COMPUTE[0]} --container-image={REGISTRY_IMAGE} grep ^VARIANT_ID= /etc/os-release")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["VARIANT_ID=berth-mpi-test"]


def test_pyxis_finds_its_named_container_again():
    job = srun(f"-w {COMPUTE[0]} --container-name=keep ls /kept")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["/kept"]


def test_the_sites_own_plugin_acts_with_pyxis_again():
    assert site_tag_job("under-pyxis-again") == site_tag_lines("under-pyxis-again")


def test_a_second_rollback_changes_nothing():
    rc, output, recap = play("playbooks/rollback.yml")
    assert rc == 0, output
    assert recap == dict.fromkeys(NODES, 0), output
