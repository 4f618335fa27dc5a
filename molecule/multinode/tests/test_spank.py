"""srun/sbatch --container-* on the deployed cluster: every task of a
two-node MPI job inside the container, PMIx and PMI2, the flags, bad input
refused before submission, and nothing left behind."""

import re
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, job_ids, node

IMAGE_SQSH = "/opt/berth-images/mpi-test.sqsh"
IMAGE_SIF = "/opt/berth-images/mpi-test.sif"  # the same root, with /.singularity.d, by siftool
REGISTRY_IMAGE = f"{CONTROLLER}:5000#berth/mpi-test:1"
OPENMPI = "/opt/mpi-test/allreduce-openmpi"
MPICH = "/opt/mpi-test/allreduce-mpich"


def srun(args, user="alice"):
    return node(CONTROLLER).run(f"runuser -u {user} -- srun {args}")


def assert_mpi_ranks(job, size):
    assert job.rc == 0, job.stdout + job.stderr
    ranks = re.findall(rf"^rank (\d+) of {size} on (\S+)$", job.stdout, re.M)
    assert sorted(int(rank) for rank, _ in ranks) == list(range(size)), job.stdout
    assert {host for _, host in ranks} == set(COMPUTE)
    assert f"allreduce sum {size * (size + 1) // 2}" in job.stdout


def no_containers_left():
    for name in COMPUTE:
        host = node(name)
        assert host.run("runuser -u alice -- berth list").stdout.strip() == ""
        assert "squashfuse" not in host.file("/proc/mounts").content_string
        assert host.run("pgrep -u alice -f 'berth start'").rc == 1


def test_login_node_srun_lists_the_flags():
    help_text = node(CONTROLLER).check_output("srun --help")
    for flag in ("--container-image", "--container-mounts", "--container-name", "--container-remap-root"):
        assert flag in help_text


def test_openmpi_pmix_four_ranks_two_nodes_in_the_squashfs():
    job = srun(f"-N2 -n4 --mpi=pmix --container-image={IMAGE_SQSH} {OPENMPI}")
    assert_mpi_ranks(job, 4)
    no_containers_left()


def test_tasks_see_the_image_not_the_host():
    job = srun(f"-N2 --ntasks-per-node=1 --container-image={IMAGE_SQSH} grep ^VARIANT_ID= /etc/os-release")
    assert job.rc == 0, job.stderr
    assert job.stdout.splitlines() == ["VARIANT_ID=berth-mpi-test"] * 2


def test_openmpi_pmix_from_the_registry():
    job = srun(f"-N2 -n2 --mpi=pmix --container-image={REGISTRY_IMAGE} {OPENMPI}")
    assert_mpi_ranks(job, 2)
    # Mounted from the user's image cache on disk: no copy in runtime_path
    # (tmpfs), and a second step builds nothing.
    for name in COMPUTE:
        host = node(name)
        uid = host.check_output("id -u alice")
        cached = host.check_output(f"ls -i /var/lib/berth/cache/{uid}/images")
        assert ".sqsh" in cached
        assert not host.file(f"/run/berth/{uid}/spank/images").exists
        again = srun(f"-w {name} --container-image={REGISTRY_IMAGE} true")
        assert again.rc == 0, again.stderr
        assert host.check_output(f"ls -i /var/lib/berth/cache/{uid}/images") == cached


def test_a_sif_image_runs_mpi_on_two_nodes_with_its_own_environment():
    # allreduce-openmpi by name: the SIF's environment script puts its
    # directory on PATH, and every task, on both nodes, has that PATH
    job = srun(f"-N2 -n4 --mpi=pmix --container-image={IMAGE_SIF} allreduce-openmpi")
    assert_mpi_ranks(job, 4)
    seen = srun(f"-N2 --ntasks-per-node=1 --container-image={IMAGE_SIF} "
                "sh -c 'echo $MPI_TEST_IMAGE $(grep ^VARIANT_ID= /etc/os-release)'")
    assert seen.stdout.splitlines() == ["sif VARIANT_ID=berth-mpi-test"] * 2, seen.stderr
    # `apptainer run`'s equivalent: the runscript as the step's command
    run = srun(f"-N1 -n2 --mpi=pmix --container-image={IMAGE_SIF} /.singularity.d/runscript")
    assert run.rc == 0 and "allreduce sum 3" in run.stdout, run.stdout + run.stderr
    no_containers_left()


def test_a_broken_sif_is_refused_at_submission_naming_the_file_and_why():
    for name in (CONTROLLER, COMPUTE[0]):
        node(name).run(f"head -c 200000 {IMAGE_SIF} >/tmp/cut.sif && chmod 0644 /tmp/cut.sif")
    before = job_ids()
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image=/tmp/cut.sif true")
    assert job.rc != 0
    assert ("spank_berth: --container-image: /tmp/cut.sif: SIF object 1: bytes 32768.."
            in job.stderr), job.stderr
    assert "lie outside the 200000-byte file (truncated or corrupted)" in job.stderr
    assert job_ids() <= before  # refused by srun itself: no job
    # the node refuses it as well, in the same words (a file that differs there)
    node(CONTROLLER).run(f"cp {IMAGE_SIF} /tmp/cut.sif")
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image=/tmp/cut.sif true")
    assert job.rc != 0 and "/tmp/cut.sif: SIF object 1: bytes 32768.." in job.stderr
    node(CONTROLLER).run("rm -f /tmp/cut.sif")
    no_containers_left()


def test_mpich_pmi2_inherits_pmi_fd():
    # PMI2 of MPICH inside the container; PMI_FD is the descriptor slurmstepd
    # opened, which must survive into the container. Two tasks on one node:
    # across the two nodes the wire-up works too (every rank prints and the
    # allreduce completes), but about one run in ten then hangs in
    # MPI_Finalize, one rank in the PMI barrier and the other in UCX's
    # disconnect: the ch4:ucx finalize race of Debian 12's MPICH 4.0.2 that
    # MPICH fixed later (pmodels/mpich#6596). One node's ranks talk through
    # MPICH's shared memory and never reach that code.
    job = srun(f"-N1 -n2 --mpi=pmi2 --container-image={IMAGE_SQSH} {MPICH}")
    assert job.rc == 0, job.stdout + job.stderr
    ranks = re.findall(r"^rank (\d+) of 2 on (\S+)$", job.stdout, re.M)
    assert sorted(int(rank) for rank, _ in ranks) == [0, 1], job.stdout
    assert "allreduce sum 3" in job.stdout


def test_the_mpi_hook_runs_the_images_mpich_program_on_the_nodes_mpich():
    """The MPI replacement hook, turned on by the job's environment (the
    scenario's enroot.conf names the node's MPICH, which prepare installs on
    the compute nodes): the library the image's loader opens for
    libmpich.so.12 is the node's file (its device and inode as the node sees
    them), and the image's unchanged MPICH program computes the allreduce
    over PMI2 with it. Off, the image's own file. (An Open MPI image is
    refused: tests/test_hook_mpi.py; this image has both.)"""
    library = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"
    host = node(COMPUTE[0])
    nodes_file = host.check_output(f"stat -L -c %d:%i {library}").strip()
    script = f"stat -L -c %d:%i {library}; exec {MPICH}"
    job = node(CONTROLLER).run(
        f"cd /tmp && runuser -u alice -- env BERTH_HOOK_MPI_ENABLE=yes srun -N1 -w {COMPUTE[0]} "
        f"-n2 --mpi=pmi2 --container-image={IMAGE_SQSH} sh -c {shlex.quote(script)}")
    assert job.rc == 0, job.stdout + job.stderr
    assert job.stdout.splitlines().count(nodes_file) == 2, job.stdout
    ranks = re.findall(r"^rank (\d+) of 2 on (\S+)$", job.stdout, re.M)
    assert sorted(int(rank) for rank, _ in ranks) == [0, 1], job.stdout
    assert "allreduce sum 3" in job.stdout
    own = srun(f"-N1 -w {COMPUTE[0]} --container-image={IMAGE_SQSH} stat -L -c %d:%i {library}")
    assert own.rc == 0 and own.stdout.strip() != nodes_file, own.stderr


# The Debian release of the nodes, and the other one, whose MPI test image
# /opt/berth-test-images/OTHER/ holds (molecule.yml mounts every release's).
OTHER_RELEASE = {"bookworm": "trixie", "trixie": "bookworm"}


def other_release_image():
    release = node(CONTROLLER).check_output(". /etc/os-release && echo $VERSION_CODENAME")
    return OTHER_RELEASE[release], f"/opt/berth-test-images/{OTHER_RELEASE[release]}/mpi-test.sqsh"


def test_image_of_the_other_debian_release_runs_mpi_across_nodes():
    # What users do: run an image built on one release on nodes of another.
    # On Debian 13 nodes a Debian 12 image's Open MPI 4.1 (a PMIx 4 client)
    # wires up through Slurm 24.11's pmix_v5 server; on Debian 12 nodes a
    # Debian 13 image's Open MPI 5 (PMIx 5) through 22.05's pmix_v4. PMI2
    # is a wire protocol of its own, the same in both MPICH releases.
    release, image = other_release_image()
    seen = srun(f"-N2 --ntasks-per-node=1 --container-image={image} "
                "sh -c '. /etc/os-release && echo $VERSION_CODENAME'")
    assert seen.stdout.split() == [release] * 2, seen.stdout + seen.stderr
    assert_mpi_ranks(srun(f"-N2 -n4 --mpi=pmix --container-image={image} {OPENMPI}"), 4)
    mpich = srun(f"-N1 -n2 --mpi=pmi2 --container-image={image} {MPICH}")
    assert mpich.rc == 0, mpich.stdout + mpich.stderr
    assert "allreduce sum 3" in mpich.stdout
    no_containers_left()


def test_mounts_read_only_and_read_write():
    for name in COMPUTE:
        node(name).run("install -d -o alice /home/alice/data && echo host-file > /home/alice/data/in")
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image={IMAGE_SQSH} "
               "--container-mounts=/home/alice/data:/data:ro,/home/alice/data:/rw "
               "sh -c 'cat /data/in; touch /data/x 2>&1 | grep -c Read-only; echo new > /rw/out'")
    assert job.rc == 0, job.stderr
    assert job.stdout.splitlines() == ["host-file", "1"]
    assert node(COMPUTE[0]).file("/home/alice/data/out").content_string == "new\n"
    assert node(COMPUTE[0]).file("/home/alice/data/out").user == "alice"


def test_workdir_flag_and_image_workdir():
    image_default = srun(f"-N1 --container-image={IMAGE_SQSH} pwd")
    flagged = srun(f"-N1 --container-image={IMAGE_SQSH} --container-workdir=/tmp pwd")
    assert flagged.stdout.strip() == "/tmp", flagged.stderr
    assert image_default.rc == 0, image_default.stderr


def test_named_container_keeps_files_between_steps():
    first = srun(f"-N1 -w {COMPUTE[1]} --container-image={IMAGE_SQSH} --container-name=keep "
                 "--container-writable sh -c 'echo kept > /opt/mpi-test/note'")
    assert first.rc == 0, first.stderr
    second = srun(f"-N1 -w {COMPUTE[1]} --container-name=keep cat /opt/mpi-test/note")
    assert second.rc == 0, second.stderr
    assert second.stdout.strip() == "kept"
    assert "pyxis_keep" in node(COMPUTE[1]).check_output("runuser -u alice -- berth list")
    node(COMPUTE[1]).run("runuser -u alice -- berth remove -f pyxis_keep")


def test_remap_root_owns_host_files_as_the_user():
    node(COMPUTE[0]).run("install -d -o alice /home/alice/remap && rm -f /home/alice/remap/f")
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image={IMAGE_SQSH} --container-remap-root "
               "--container-mounts=/home/alice/remap:/remap sh -c 'id -u; touch /remap/f'")
    assert job.rc == 0, job.stderr
    assert job.stdout.strip() == "0"
    assert node(COMPUTE[0]).file("/home/alice/remap/f").user == "alice"


def test_writable_and_readonly():
    writable = srun(f"-N1 --container-image={IMAGE_SQSH} --container-writable touch /opt/w")
    readonly = srun(f"-N1 --container-image={IMAGE_SQSH} --container-readonly touch /opt/w")
    assert writable.rc == 0, writable.stderr
    assert readonly.rc != 0
    assert "Read-only file system" in readonly.stdout + readonly.stderr


def test_container_env_keeps_the_tasks_value():
    image_path = srun(f"-N1 --container-image={IMAGE_SQSH} printenv PATH")
    kept = node(CONTROLLER).run(
        f"runuser -u alice -- env PATH=/custom:/usr/bin:/bin srun -N1 --container-image={IMAGE_SQSH} "
        "--container-env=PATH /usr/bin/printenv PATH")
    assert kept.rc == 0, kept.stderr
    assert kept.stdout.strip() == "/custom:/usr/bin:/bin"
    assert image_path.stdout.strip() != "/custom:/usr/bin:/bin"


def test_tasks_get_what_the_images_login_shell_exports():
    """ENROOT_LOGIN_SHELL (yes, enroot's default): the container starts
    through the image's login shell, so Debian's /etc/profile (which sets
    PATH) and the image's /etc/profile.d reach every task, as under pyxis;
    `no` in the job's environment leaves PATH as the start made it (this
    squashfs of the root alone has no image config: Berth's default PATH)."""
    login = srun(f"-N2 --ntasks-per-node=1 --container-image={IMAGE_SQSH} printenv PATH")
    assert login.rc == 0, login.stderr
    assert login.stdout.split() == [
        "/opt/mpi-test:/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"] * 2
    plain = node(CONTROLLER).run(
        f"cd /tmp && runuser -u alice -- env ENROOT_LOGIN_SHELL=no srun -N1 "
        f"--container-image={IMAGE_SQSH} printenv PATH")
    assert plain.rc == 0, plain.stderr
    assert plain.stdout.strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_container_save_writes_a_squashfs():
    node(COMPUTE[0]).run("install -d -o alice /home/alice/saved && rm -f /home/alice/saved/s.sqsh")
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image={IMAGE_SQSH} --container-writable "
               "--container-save=/home/alice/saved/s.sqsh sh -c 'echo saved > /opt/mpi-test/marker'")
    assert job.rc == 0, job.stderr
    listing = node(COMPUTE[0]).check_output("unsquashfs -l /home/alice/saved/s.sqsh")
    assert "/opt/mpi-test/marker" in listing


def test_sbatch_container_image_runs_the_batch_script_in_the_container():
    # as pyxis: the script itself; an srun in it would need Slurm in the image
    script = (f"#!/bin/bash\n#SBATCH --container-image={IMAGE_SQSH}\n#SBATCH -N2 -n2\n"
              "grep ^VARIANT_ID= /etc/os-release\n"
              "echo \"inherited=$SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image\"\n")
    job = node(CONTROLLER).run(
        f"cd /home/alice && printf '%s' {shlex.quote(script)} | runuser -u alice -- sbatch --wait -o out.%j")
    assert job.rc == 0, job.stderr
    job_id = re.search(r"Submitted batch job (\d+)", job.stdout).group(1)
    output = node(CONTROLLER).file(f"/home/alice/out.{job_id}")
    # The output file is written on the batch host; fetch it from there.
    text = output.content_string if output.exists else ""
    if not text:
        for name in COMPUTE:
            candidate = node(name).file(f"/home/alice/out.{job_id}")
            if candidate.exists:
                text = candidate.content_string
    assert text.splitlines() == ["VARIANT_ID=berth-mpi-test", f"inherited={IMAGE_SQSH}"]


@pytest.mark.parametrize("flag, message", [
    ("--container-image=", "--container-image"),
    ("--container-image=/no/such.sqsh", "/no/such.sqsh"),
    (f"--container-image={IMAGE_SQSH} --container-mounts=/data:", "missing destination in '/data:'"),
    (f"--container-image={IMAGE_SQSH} --container-workdir=", "--container-workdir: empty path"),
    (f"--container-image={IMAGE_SQSH} --container-unshare=pid", "--container-unshare"),
])
def test_bad_flags_are_refused_before_submission(flag, message):
    before = job_ids()
    job = srun(f"-N1 {flag} true")
    assert job.rc != 0
    errors = [line for line in job.stderr.splitlines() if "spank_berth" in line]
    assert errors and message in errors[0], job.stderr
    assert job_ids() <= before  # no new job


def test_missing_registry_image_fails_the_step_and_leaves_nothing():
    job = srun(f"-N2 --container-image={CONTROLLER}:5000#no/such:1 true")
    assert job.rc != 0
    assert "no/such" in job.stderr
    no_containers_left()


def test_killing_one_task_ends_the_step_and_leaves_nothing():
    job = srun(f"-N2 -n2 --kill-on-bad-exit=1 --container-image={IMAGE_SQSH} "
               "sh -c 'if [ $SLURM_PROCID = 0 ]; then kill -9 $$; fi; sleep 60'")
    assert job.rc != 0
    no_containers_left()
