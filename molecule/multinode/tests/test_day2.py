"""Day-2 changes on the converged cluster never kill a running job (#15):
a changed slurm.conf is applied with scontrol reconfigure, a rebuilt SPANK
plugin restarts nothing, and playbooks/upgrade.yml takes one compute node at
a time, waits for its jobs, and leaves a node that fails its smoke step
drained, saying why, without touching the next one.

The job these tests keep running is a two-node containerized step that waits
until the test releases it (a file in a directory bind-mounted into the
container on each node), so that it certainly runs through the change under
test, and then ends with exit 0. Every wait is bounded."""

import contextlib
import os
import re
import shlex
import subprocess
import time

import pytest

from conftest import (
    COMPUTE,
    CONTROLLER,
    NODES,
    PROJECT,
    SLURM_PLAY,
    SPANK_PLAY,
    inventory_copy,
    node,
    play,
)

IMAGE_SQSH = "/opt/berth-images/mpi-test.sqsh"
RELEASE_DIR = "/var/tmp/berth-day2"
# A step that waits (at most 30 min) until RELEASE_DIR/go exists on its node.
HELD_STEP = (f"srun --container-image={IMAGE_SQSH} --container-mounts={RELEASE_DIR}:/mnt "
             "sh -c 'i=0; while [ ! -e /mnt/go ] && [ $i -lt 900 ]; do sleep 2; i=$((i+1)); done; "
             "test -e /mnt/go'")
BUILD_TASK = "spank_plugin : Build spank_berth.so against the installed Slurm (again only on a source or Slurm change)"
RECONFIGURE = "slurm : Apply the new slurm.conf with scontrol reconfigure"


def ctl(command):
    return node(CONTROLLER).run(command)


def run_playbook(inventory, playbook, *args, timeout=1800):
    """ansible-playbook `playbook` against the scenario; (exit code, output)."""
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), playbook, *args],
        cwd=PROJECT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"})
    return result.returncode, result.stdout + result.stderr


def section(output, title):
    """What Ansible printed under the task or handler `title`; None when it did not run."""
    parts = re.split(r"^(?:TASK|RUNNING HANDLER) \[(.*?)\] \**$", output, flags=re.M)
    bodies = [parts[i + 1] for i in range(1, len(parts) - 1, 2) if parts[i] == title]
    return "\n".join(bodies) if bodies else None


def daemons():
    """Each Slurm daemon's unit start time (a restart moves it) and, before
    Slurm 24.05, its main pid. From 24.05 on `scontrol reconfigure` has each
    daemon execute itself anew in place: a new pid that it tells systemd,
    the unit not restarted, running jobs untouched."""
    release = re.search(r"(\d+)\.(\d+)", ctl("sinfo --version").stdout).groups()
    keys = "-p ActiveEnterTimestampMonotonic" + (" -p MainPID" if tuple(map(int, release)) < (24, 5) else "")
    units = [(CONTROLLER, "slurmctld")] + [(name, "slurmd") for name in COMPUTE]
    return {(host, unit): node(host).check_output(f"systemctl show {keys} {unit}")
            for host, unit in units}


def state(name):
    return ctl(f"sinfo -h -n {name} -o %T").stdout.strip()


def reason(name):
    found = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?$", ctl(f"scontrol show node {name}").stdout, re.M)
    return found.group(1) if found else ""


def job_state(job_id):
    text = ctl(f"scontrol show job {job_id}").stdout
    found = re.search(r"JobState=(\S+)", text)
    code = re.search(r"\bExitCode=(\S+)", text)
    return (found.group(1) if found else "gone"), (code.group(1) if code else "")


def wait_job(job_id, states, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = job_state(job_id)
        if current[0] in states:
            return current
        time.sleep(2)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {job_state(job_id)}")


def release():
    for name in COMPUTE:
        node(name).run(f"touch {RELEASE_DIR}/go")


@contextlib.contextmanager
def held_job():
    """A running two-node containerized job, released (and cancelled if still
    there) when the block ends; yields its id."""
    for name in COMPUTE:
        node(name).check_output(f"rm -rf {RELEASE_DIR} && install -d -o alice -m 0755 {RELEASE_DIR}")
    submitted = ctl(f"cd /tmp && runuser -u alice -- sbatch --parsable -N2 -o /dev/null "
                    f"--wrap {shlex.quote(HELD_STEP)}")
    assert submitted.rc == 0, submitted.stderr
    job_id = re.match(r"(\d+)", submitted.stdout.strip()).group(1)
    try:
        assert wait_job(job_id, {"RUNNING"}, 120)[0] == "RUNNING"
        # the step itself (and so its container) is up on both nodes
        deadline = time.monotonic() + 120
        while f"{job_id}.0" not in ctl(f"squeue -h -s -j {job_id} -o %i").stdout:
            assert time.monotonic() < deadline, f"job {job_id}: no step 0 after 120 s"
            time.sleep(2)
        yield job_id
    finally:
        release()
        with contextlib.suppress(AssertionError):
            wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "gone"}, 60)
        ctl(f"scancel {job_id}")


def stamps():
    return {name: node(name).check_output("ls /usr/lib/*/slurm-wlm/spank_berth.so.stamp") for name in NODES}


def inodes():
    return {name: node(name).check_output("stat -c %i /usr/lib/*/slurm-wlm/spank_berth.so") for name in NODES}


@pytest.fixture()
def cluster_back_in_service():
    """After the test: no reservation of upgrade.yml left, every compute node
    that an upgrade left drained resumed."""
    yield
    for name in COMPUTE:
        ctl(f"scontrol delete reservationname=berth-upgrade-{name}")
        if "drain" in state(name) and reason(name).startswith("berth upgrade"):
            ctl(f"scontrol update nodename={name} state=resume")


def test_slurm_conf_change_and_plugin_rebuild_under_a_running_job_restart_nothing(tmp_path):
    inventory = inventory_copy(tmp_path)
    try:
        with held_job() as job_id:
            for name, stamp in stamps().items():
                node(name).check_output(f"echo '{{}}' > {stamp}")  # berth_spank rebuilds
            before, so_before = daemons(), inodes()
            # the two layers of site.yml the change is about, in one run
            rc, output, recap = play(inventory, "-e", '{"slurm_extra_config": {"KillWait": 31}}',
                                     playbook=[SLURM_PLAY, SPANK_PLAY])
            assert rc == 0, output[-3000:]
            assert job_state(job_id)[0] == "RUNNING"  # it ran through both plays
            # one reconfigure applied the new slurm.conf, and no daemon restarted
            applied = section(output, RECONFIGURE)
            assert applied is not None and "changed:" in applied, output[-5000:]
            assert "no restart; scontrol reconfigure" in output
            assert daemons() == before
            for restart in ("slurm : Restart slurmctld", "slurm : Restart slurmd, one node at a time"):
                assert "changed:" not in (section(output, restart) or ""), section(output, restart)
                assert "included:" not in (section(output, restart) or "")
            assert all("KillWait=31" in node(name).file("/etc/slurm/slurm.conf").content_string
                       for name in NODES)
            assert re.search(r"^KillWait\s*=\s*31 sec", ctl("scontrol show config").stdout, re.M)
            # the plugin was rebuilt on every node and swapped in under the job
            built = section(output, BUILD_TASK)
            assert built is not None, output[-5000:]
            for name in NODES:
                assert re.search(rf"^changed: \[{name}\]", built, re.M), built
            assert all(so_before[name] != now for name, now in inodes().items())
            release()
            assert wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, 120) \
                == ("COMPLETED", "0:0")
    finally:  # the scenario's own slurm.conf (the rebuilt plugin stays)
        rc, output, recap = play(inventory, playbook=SLURM_PLAY)
        assert rc == 0, output[-3000:]
    assert "KillWait" not in node(COMPUTE[0]).file("/etc/slurm/slurm.conf").content_string


def test_upgrade_waits_for_the_running_job_and_resumes_every_node(tmp_path, cluster_back_in_service):
    inventory = inventory_copy(tmp_path)
    log = tmp_path / "upgrade.log"
    with held_job() as job_id:
        with open(log, "w") as out:
            upgrade = subprocess.Popen(
                # the job ends a few seconds after the drain: see it end within 2 s
                ["ansible-playbook", "-i", str(inventory), "playbooks/upgrade.yml",
                 "-e", "berth_upgrade_poll_seconds=2"],
                cwd=PROJECT, stdout=out, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"})
        try:
            # the first compute node is drained, and the play waits for the job on it
            deadline = time.monotonic() + 1200
            while "drain" not in state(COMPUTE[0]):
                assert upgrade.poll() is None, log.read_text()[-5000:]
                assert time.monotonic() < deadline, "no drain after 1200 s: " + log.read_text()[-3000:]
                time.sleep(3)
            time.sleep(10)  # a while draining: the job must still run and the node not be upgraded yet
            assert job_state(job_id)[0] == "RUNNING"
            assert "draining" in state(COMPUTE[0]), state(COMPUTE[0])  # drained, with the job still on it
            assert reason(COMPUTE[0]) == "berth upgrade: draining for the Slurm and Berth upgrade"
            assert "drain" not in state(COMPUTE[1])  # one node at a time
            release()
            assert wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, 120) \
                == ("COMPLETED", "0:0")
            rc = upgrade.wait(timeout=1500)
        finally:
            if upgrade.poll() is None:
                upgrade.kill()
                upgrade.wait(timeout=30)
    output = log.read_text()
    assert rc == 0, output[-5000:]
    for name in COMPUTE:
        assert state(name) in ("idle", "mixed", "allocated"), (name, state(name))
        assert f"berth-upgrade-{name}" not in ctl("scontrol show reservation").stdout
        smoke = section(output, "Run a containerized smoke step on the node as alice")
        assert smoke is not None and re.search(rf"^ok: \[{name} -> {CONTROLLER}\]", smoke, re.M), smoke
    assert ctl("cd /tmp && runuser -u alice -- srun -N2 hostname").rc == 0


def test_upgrade_with_a_failing_smoke_step_leaves_the_first_node_drained_and_stops(
        tmp_path, cluster_back_in_service):
    inventory = inventory_copy(tmp_path)
    assert all("drain" not in state(name) for name in COMPUTE)
    second_before = node(COMPUTE[1]).check_output(
        "systemctl show -p MainPID -p ActiveEnterTimestampMonotonic slurmd")
    rc, output = run_playbook(inventory, "playbooks/upgrade.yml",
                              "-e", "berth_upgrade_smoke_image=/opt/berth-images/no-such-image.sqsh")
    assert rc != 0, output[-5000:]
    first, second = COMPUTE
    assert "drain" in state(first), state(first)
    assert reason(first).startswith("berth upgrade: smoke step failed: "), reason(first)
    assert f"{first}: berth upgrade: smoke step failed: " in output
    assert f"berth-upgrade-{first}" not in ctl("scontrol show reservation").stdout
    # the play stopped before the second node: not drained, its slurmd not restarted
    assert "drain" not in state(second), state(second)
    assert node(second).check_output(
        "systemctl show -p MainPID -p ActiveEnterTimestampMonotonic slurmd") == second_before
    smoke = section(output, "Run a containerized smoke step on the node as alice") or ""
    assert second not in smoke
