"""After the move (site.yml with berth_slurm_managed: false, converged twice):
the site's Slurm is as it was, Berth's plugin and runtime answer the same
flags, and what a user made with pyxis is found again."""


import pytest

from conftest import (
    COMPUTE,
    CONTROLLER,
    NODES,
    REGISTRY_IMAGE,
    job_id,
    marks,
    mpi_job_on_both,
    node,
    site_files,
    site_files_before,
    site_tag_job,
    site_tag_lines,
    srun,
)


def test_the_sites_slurm_files_are_untouched():
    for name in NODES:
        before = {line.split()[0]: line for line in site_files_before(name)}
        now = {line.split()[0]: line for line in site_files(name)}
        for path in ("/etc/slurm/slurm.conf", "/etc/slurm/prolog.d/10-site-mark.sh",
                     "/etc/slurm/epilog.d/10-site-mark.sh"):
            assert now[path] == before[path], name


def test_pyxis_is_set_aside_and_berths_plugin_loaded():
    for name in NODES:
        host = node(name)
        assert not host.file("/etc/slurm/plugstack.conf.d/pyxis.conf").exists
        assert "berth" in host.file("/etc/slurm/plugstack.conf.d/berth.conf").content_string
    for name in COMPUTE:
        assert node(name).file("/usr/local/bin/enroot").linked_to == "/opt/berth/bin/berth"


@pytest.mark.parametrize(("partition", "nodes"), [("batch", COMPUTE), ("debug", COMPUTE[:1])])
def test_the_sites_partitions_run_its_prolog_and_epilog(partition, nodes):
    job = srun(f"-p {partition} -N{len(nodes)} printenv SLURM_JOB_ID")
    assert marks(job_id(job), nodes) == {(script, name) for script in ("prolog", "epilog") for name in nodes}


def test_berth_finds_the_named_container_pyxis_made():
    job = srun(f"-w {COMPUTE[0]} --container-name=keep sh -c 'ls /kept && grep ^VARIANT_ID= /etc/os-release'")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["/kept", "VARIANT_ID=berth-mpi-test"]


def test_a_container_image_mpi_job_on_two_nodes():
    mpi_job_on_both()


def test_the_sites_own_plugin_acts_with_pyxis_before_and_berth_now():
    before = node(COMPUTE[0]).file("/shared/site-tag-under-pyxis.txt").content_string
    assert sorted(before.splitlines()) == site_tag_lines("under-pyxis")
    assert site_tag_job("under-berth") == site_tag_lines("under-berth")


def test_a_squashfs_pyxis_saved_is_the_users_first_berth_image():
    job = srun(f"-w {COMPUTE[0]} --container-image=/shared/alice/saved.sqsh "
               "sh -c 'cat /made-here && grep ^VARIANT_ID= /etc/os-release'")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["made-under-pyxis", "VARIANT_ID=berth-mpi-test"]


def test_enroots_layer_cache_is_left_as_it_is_and_the_registry_image_runs():
    """pyxis's import on berth-adopt-cn1 left enroot's cache there
    (prepare.yml); Berth cannot take its layers and pulls the image again."""
    cache = "/var/lib/enroot/cache/user-2001"
    recorded = node(CONTROLLER).file("/shared/enroot-cache-before.txt").content_string.split()
    enroots = dict(zip(recorded[1::2], recorded[::2], strict=True))  # name: SHA-256 of its bytes
    job = srun(f"-w {COMPUTE[0]} --container-image={REGISTRY_IMAGE} grep ^VARIANT_ID= /etc/os-release")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.split() == ["VARIANT_ID=berth-mpi-test"]
    cn1 = node(COMPUTE[0])
    assert {name: cn1.file(f"{cache}/{name}").sha256sum for name in enroots} == enroots
    # enroot names each blob by its registry digest, its bytes recompressed
    assert enroots and all(name != digest for name, digest in enroots.items())
    blobs = cn1.check_output(f"ls {cache}/blobs/sha256").split()
    assert blobs and set(blobs) <= set(enroots), blobs
    assert all(cn1.file(f"{cache}/blobs/sha256/{blob}").sha256sum == blob for blob in blobs)
