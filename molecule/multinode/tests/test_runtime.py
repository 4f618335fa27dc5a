"""The berth runtime as site.yml deploys it, used by an ordinary user in Slurm
jobs on both compute nodes: a local squashfs and an image from the
scenario's registry (Debian's docker-registry on the controller)."""

import re
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, node

IMAGE_SQSH = "/opt/berth-images/mpi-test.sqsh"
REGISTRY_IMAGE = f"docker://{CONTROLLER}:5000#berth/mpi-test:1"


def as_alice(command):
    return node(CONTROLLER).run(f"runuser -u alice -- {command}")


def job_script(compute, script):
    """Run a bash script as alice in a one-task job on one compute node."""
    return node(CONTROLLER).run(
        f"printf '%s' {shlex.quote(script)} | runuser -u alice -- srun -N1 -w {compute} bash -s"
    )


@pytest.mark.parametrize("name", COMPUTE)
def test_runtime_is_installed_with_its_configuration(name):
    host = node(name)
    assert host.file("/usr/local/bin/berth").linked_to == "/opt/berth/bin/berth"
    assert re.fullmatch(r"\d+\.\d+\.\d+", host.check_output("berth version"))
    # also as enroot (container_runtime_enroot_link), for scripts that call it
    assert host.file("/usr/local/bin/enroot").linked_to == "/opt/berth/bin/berth"
    missing = host.run("runuser -u alice -- enroot remove -f no-such-container")
    assert missing.rc == 1 and missing.stderr.startswith("enroot: error: no container named")
    conf = host.file("/etc/enroot/enroot.conf").content_string
    assert "ENROOT_DATA_PATH /var/lib/berth/data/${UID}" in conf
    assert host.file("/etc/enroot/hooks.d/10-shadow.sh").mode == 0o755


def test_squashfs_runs_on_both_nodes_as_the_user():
    job = as_alice(f"srun -N2 --ntasks-per-node=1 -l berth start {IMAGE_SQSH} "
                   "sh -c 'grep ^VARIANT_ID= /etc/os-release; id -un; hostname'")
    assert job.rc == 0, job.stderr
    for rank in ("0", "1"):
        lines = [line.split(": ", 1)[1] for line in job.stdout.splitlines()
                 if line.startswith(f"{rank}: ")]
        assert lines[:2] == ["VARIANT_ID=berth-mpi-test", "alice"], job.stdout
    assert sorted(re.findall(r"^\d: (berth-cn\d)$", job.stdout, re.M)) == COMPUTE


def test_root_is_read_only_by_default():
    job = as_alice(f"srun -N1 berth start {IMAGE_SQSH} touch /opt/mpi-test/x")
    assert job.rc != 0
    assert "Read-only file system" in job.stdout + job.stderr


def test_registry_import_then_create_and_start():
    job = job_script(COMPUTE[0], f"""
        set -e; cd "$(mktemp -d)"
        trap 'berth remove -f mpitest 2>/dev/null || true' EXIT  # (gone already: an error)
        berth -q import -o img.sqsh '{REGISTRY_IMAGE}'
        berth create -n mpitest img.sqsh
        berth start mpitest sh -c 'pwd; grep ^VARIANT_ID= /etc/os-release'
        berth list; berth remove -f mpitest; berth list
    """)
    assert job.rc == 0, job.stderr
    lines = job.stdout.splitlines()
    assert lines[:3] == ["/opt/mpi-test", "VARIANT_ID=berth-mpi-test", "mpitest"], job.stdout
    assert "mpitest" not in lines[3:]


def test_unknown_image_is_one_clear_line_and_leaves_nothing():
    job = job_script(COMPUTE[1], f"""
        cd "$(mktemp -d)"
        berth -q import -o x.sqsh 'docker://{CONTROLLER}:5000#no/such:1'
        echo rc=$?; ls
    """)
    errors = [line for line in job.stderr.splitlines() if line.startswith("berth: error:")]
    assert len(errors) == 1 and "no/such" in errors[0], job.stderr
    assert "rc=1" in job.stdout
    assert "x.sqsh" not in job.stdout


def test_cache_prune_timer_removes_what_was_not_used_for_30_days():
    host = node(COMPUTE[0])
    timer = host.service("berth-cache-prune.timer")
    assert timer.is_enabled and timer.is_running
    uid = host.run("id -u alice").stdout.strip()
    blobs = f"/var/lib/berth/cache/{uid}/blobs/sha256"
    old, recent = f"{blobs}/{'a' * 64}", f"{blobs}/{'b' * 64}"
    host.run("/opt/berth/bin/berth setup-user alice")
    made = host.run(f"runuser -u alice -- sh -c 'mkdir -p {blobs} && echo old > {old} && "
                    f"echo recent > {recent} && touch -d \"40 days ago\" {old}'")
    assert made.rc == 0, made.stderr
    try:
        pruned = host.run("systemctl start berth-cache-prune.service")
        assert pruned.rc == 0, pruned.stderr
        assert not host.file(old).exists
        assert host.file(recent).exists
    finally:
        host.run(f"rm -f {old} {recent}")

