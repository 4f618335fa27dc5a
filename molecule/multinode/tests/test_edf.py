"""srun --environment on the deployed cluster: an EDF in the user's ~/.edf on
the login node, resolved at submission, applied on both compute nodes."""

import re
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, job_ids, node

EDF = """\
image = "/opt/berth-images/mpi-test.sqsh"
workdir = "/edf-work"
mounts = ["/home/alice/edfdata:/edf-work:ro"]

[env]
EDF_MARKER = "from-the-edf"
"""


@pytest.fixture(scope="module")
def edf():
    node(CONTROLLER).run(
        f"install -d -o alice /home/alice/.edf && printf '%s' {shlex.quote(EDF)} "
        "> /home/alice/.edf/edftest.toml && chown alice /home/alice/.edf/edftest.toml")
    for name in COMPUTE:
        node(name).run(f"install -d -o alice /home/alice/edfdata && echo {name} > /home/alice/edfdata/marker")
    yield "edftest"
    node(CONTROLLER).run("rm -f /home/alice/.edf/edftest.toml")


def srun(args):
    return node(CONTROLLER).run(f"cd /home/alice && runuser -u alice -- srun {args}")


def test_environment_gives_image_mounts_env_and_workdir_on_both_nodes(edf):
    job = srun(f"-N2 --ntasks-per-node=1 -l --environment={edf} "
               "sh -c 'pwd; echo $EDF_MARKER; cat marker; grep ^VARIANT_ID= /etc/os-release'")
    assert job.rc == 0, job.stderr
    for rank, compute in enumerate(COMPUTE):
        lines = [line.split(": ", 1)[1] for line in job.stdout.splitlines()
                 if line.startswith(f"{rank}: ")]
        assert sorted(lines) == sorted(["/edf-work", "from-the-edf", compute,
                                        "VARIANT_ID=berth-mpi-test"]), job.stdout


def test_workdir_flag_overrides_the_edf(edf):
    job = srun(f"-N2 --ntasks-per-node=1 --environment={edf} --container-workdir=/tmp pwd")
    assert job.rc == 0, job.stderr
    assert job.stdout.splitlines() == ["/tmp", "/tmp"]


def test_broken_edf_is_refused_before_submission(edf):
    node(CONTROLLER).run("printf 'imagee = \"x\"\\n' > /home/alice/.edf/broken.toml && "
                         "chown alice /home/alice/.edf/broken.toml")
    before = job_ids()
    job = srun("-N1 --environment=broken true")
    assert job.rc != 0
    assert "--environment" in job.stderr and "broken.toml:1" in job.stderr, job.stderr
    assert "imagee" in job.stderr
    assert job_ids() <= before  # no new job


def test_an_edf_may_name_a_sif_image(edf):
    node(CONTROLLER).run(
        "printf '%s\\n' 'image = \"/opt/berth-images/mpi-test.sif\"' '[env]' "
        "'EDF_MARKER = \"from-the-edf\"' > /home/alice/.edf/siftest.toml && "
        "chown alice /home/alice/.edf/siftest.toml")
    job = srun("-N2 --ntasks-per-node=1 --environment=siftest "
               "sh -c 'echo $MPI_TEST_IMAGE $EDF_MARKER'")
    assert job.rc == 0, job.stderr
    assert job.stdout.splitlines() == ["sif from-the-edf"] * 2  # the image's scripts, the EDF's env


# A task that starts a step of its own job, lists the job, and submits one
# (held, then cancelled: it takes no node from the tests after it).
SLURM_INSIDE = ('command -v srun; echo "job=$SLURM_JOB_ID"; srun --overlap -n1 hostname; '
                'squeue -h -j "$SLURM_JOB_ID" -o %i; '
                'held=$(sbatch --parsable --hold -o /dev/null --wrap true) && '
                'echo "held=$held" && scancel "$held"')


def test_the_slurm_hook_lets_a_task_start_steps_and_submit_jobs(edf):
    """The MPI test image has no Slurm. With the EDF's com.hooks.slurm.enabled
    (the CSCS spelling), or BERTH_HOOK_SLURM_ENABLE in the job's environment,
    a task runs the node's srun, squeue, sbatch and scancel (through the
    node's own loader and libraries): `srun --overlap` starts a step of the
    same job on the node, squeue lists the job, sbatch submits one as alice.
    Without either, the image has no srun."""
    node(CONTROLLER).run(
        "printf '%s\\n' 'image = \"/opt/berth-images/mpi-test.sqsh\"' '[annotations]' "
        "'com.hooks.slurm.enabled = \"true\"' > /home/alice/.edf/slurmhook.toml && "
        "chown alice /home/alice/.edf/slurmhook.toml")
    job = srun(f"-N1 -w {COMPUTE[0]} --environment=slurmhook sh -c {shlex.quote(SLURM_INSIDE)}")
    assert job.rc == 0, job.stdout + job.stderr
    where, job_line, host, listed, held = job.stdout.splitlines()
    assert where == "/usr/local/bin/srun"
    assert host == COMPUTE[0]
    assert job_line == f"job={listed}"
    assert re.fullmatch(r"held=\d+", held) and held[5:] != listed
    assert node(CONTROLLER).check_output(f"squeue -h -a -t all -j {held[5:]} -o %u:%T").strip() == \
        "alice:CANCELLED"

    by_env = node(CONTROLLER).run(
        f"cd /tmp && runuser -u alice -- env BERTH_HOOK_SLURM_ENABLE=yes srun -N1 -w {COMPUTE[1]} "
        "--container-image=/opt/berth-images/mpi-test.sqsh srun --overlap -n1 hostname")
    assert by_env.rc == 0, by_env.stderr
    assert by_env.stdout.strip() == COMPUTE[1]

    plain = srun("-N1 --container-image=/opt/berth-images/mpi-test.sqsh "
                 "sh -c 'command -v srun || echo none'")
    assert plain.rc == 0 and plain.stdout.strip() == "none", plain.stderr


def test_the_ssh_hook_lets_the_user_into_her_running_container_with_her_key_only(edf):
    """With the EDF's com.hooks.ssh.enabled, the batch step's container runs
    the node's dropbear on port 15263: alice's key (her authorized_keys on
    the compute node) logs her in from the login node, into the container
    with the environment of its tasks (the batch script's PATH, after the
    image's profile.d, and the EDF's [env]); bob's key does not; the server
    ends with the job."""
    login, compute = node(CONTROLLER), node(COMPUTE[0])
    for user in ("alice", "bob"):
        login.run(f"runuser -u {user} -- sh -c 'mkdir -p -m 700 ~/.ssh && "
                  "{ [ -f ~/.ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N \"\" -f ~/.ssh/id_ed25519; }'")
    key = login.check_output("cat /home/alice/.ssh/id_ed25519.pub").strip()
    compute.run(f"install -d -m 700 -o alice /home/alice/.ssh && echo {shlex.quote(key)} "
                "> /home/alice/.ssh/authorized_keys && chown alice /home/alice/.ssh/authorized_keys")
    login.run("printf '%s\\n' 'image = \"/opt/berth-images/mpi-test.sqsh\"' '[annotations]' "
              "'com.hooks.ssh.enabled = \"true\"' '[env]' 'SSH_MARKER = \"from-the-edf\"' "
              "> /home/alice/.edf/sshhook.toml && chown alice /home/alice/.edf/sshhook.toml")
    job = login.run(f"cd /tmp && runuser -u alice -- sbatch --parsable -w {COMPUTE[0]} "
                    "-o /home/alice/sshhook-%j.out --environment=sshhook "
                    "--wrap 'echo \"PATH=$PATH\"; sleep 300'")
    assert job.rc == 0, job.stderr
    job_id = job.stdout.strip()
    ssh = (f"ssh -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=accept-new "
           f"-p 15263 alice@{COMPUTE[0]}")
    try:
        inside = login.run(f"for i in $(seq 60); do runuser -u alice -- {ssh} "
                           "'grep ^VARIANT_ID= /etc/os-release; echo $SSH_MARKER; id -un; "
                           "echo \"PATH=$PATH\"' 2>/dev/null && exit 0; sleep 1; done; exit 1")
        assert inside.rc == 0, inside.stderr
        task = compute.run(f"for i in $(seq 30); do grep -h ^PATH= "
                           f"/home/alice/sshhook-{job_id}.out && exit 0; sleep 1; done; exit 1")
        assert task.rc == 0 and task.stdout.startswith("PATH=/opt/mpi-test:"), task.stdout
        assert inside.stdout.splitlines() == ["VARIANT_ID=berth-mpi-test", "from-the-edf", "alice",
                                              task.stdout.strip()]
        bob = login.run(f"runuser -u bob -- {ssh} true")
        assert bob.rc == 255 and "Permission denied" in bob.stderr, bob.stderr
    finally:
        login.run(f"scancel {job_id}")
        compute.run(f"rm -f /home/alice/sshhook-{job_id}.out")
    gone = login.run(f"for i in $(seq 30); do runuser -u alice -- {ssh} true 2>&1 | "
                     "grep -q 'Connection refused' && exit 0; sleep 1; done; exit 1")
    assert gone.rc == 0, "the server outlived the job"

