"""The move under a running job (first in verify, so converge and idempotence
ran while it ran): the batch job prepare.yml started with pyxis on
berth-adopt-cn2 kept running while every node moved, and ends well when
told to stop, its container removed."""

import re
import time

from conftest import COMPUTE, CONTROLLER, node

JOB_DIR = "/shared/rolling"


def job_state(job_id):
    """(JobState, ExitCode) of a job as slurmctld reports it (MinJobAge keeps
    an ended job's record for 300 s; the scenario runs no accounting)."""
    record = node(CONTROLLER).check_output(f"scontrol -o show job {job_id}")
    return re.search(r"JobState=(\S+)", record)[1], re.search(r"ExitCode=(\S+)", record)[1]


def test_the_pyxis_job_outlived_the_move_and_ends_well():
    ctl = node(CONTROLLER)
    job_id = ctl.file(f"{JOB_DIR}/jobid").content_string.strip()
    assert job_state(job_id)[0] == "RUNNING", "the job started under pyxis ended during the move"
    assert ctl.file("/etc/slurm/plugstack.conf.d/berth.conf").exists
    ctl.check_output(f"touch {JOB_DIR}/stop")
    deadline = time.monotonic() + 30
    while job_state(job_id)[0] in ("RUNNING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(1)
    assert job_state(job_id) == ("COMPLETED", "0:0")
    lines = ctl.file(f"{JOB_DIR}/job.out").content_string.splitlines()
    ticks = [int(line.split()[1]) for line in lines if line.startswith("tick ")]
    # one line a second, none lost, through converge and idempotence
    assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) > 60, lines[-3:]
    assert lines[len(ticks):] == [f"stopped after tick {ticks[-1]}", "VARIANT_ID=berth-mpi-test"]
    # pyxis's end of step ran `enroot remove`, which is Berth's by then
    assert not node(COMPUTE[1]).file(f"/var/lib/enroot/data/user-2001/pyxis_{job_id}.0").exists
