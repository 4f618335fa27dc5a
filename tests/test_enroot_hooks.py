"""enroot's own hooks that adopt leaves in hooks.d, run by real starts.

The hooks are taken from enroot's release tarball when the tests run, never
kept in this repository: $BERTH_UPSTREAM_DIR/enroot-4.1.2.tar.gz, where
BERTH_UPSTREAM_DIR is by default ../shared/upstream beside the repository's
root (CI's clone has ../shared beside it). A missing tarball fails the test
in one line.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENROOT = "enroot-4.1.2"


def enroot_hook(name, into):
    """enroot's stock hook `name`, written executable to the path `into`."""
    upstream = Path(os.environ.get("BERTH_UPSTREAM_DIR") or REPO.parent / "shared/upstream")
    tarball = upstream / f"{ENROOT}.tar.gz"
    if not tarball.is_file():
        pytest.fail(f"{tarball}: no such file (BERTH_UPSTREAM_DIR names the directory "
                    "of enroot's release tarball)", pytrace=False)
    with tarfile.open(tarball) as tar:
        into.write_bytes(tar.extractfile(f"{ENROOT}/conf/hooks/{name}").read())
    into.chmod(0o755)


def _cgroup2():
    """Where cgroup v2 is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified
    beside v1's controllers (a hybrid host, as this one may be)."""
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return Path(fields[4])
    return None


@pytest.fixture
def step_cgroup():
    """A job's cgroup and its step's below it, as slurmstepd makes them, in
    cgroup v2; removed after the test."""
    top = _cgroup2()
    if os.geteuid() != 0 or top is None:
        pytest.fail("needs root and cgroup v2 (it makes a job's cgroup)", pytrace=False)
    job = top / f"hconf-job-{os.getpid()}"
    (job / "step_0").mkdir(parents=True)
    yield top, job
    (job / "step_0").rmdir()
    job.rmdir()


@pytest.fixture
def node(tmp_path):
    """A runtime configuration and a busybox container `app`."""
    (tmp_path / "sys/hooks.d").mkdir(parents=True)
    root = tmp_path / "data/app"
    for directory in ("bin", "etc", "proc", "dev", "sys", "tmp"):
        (root / directory).mkdir(parents=True)
    shutil.copy(shutil.which("busybox") or "/bin/busybox", root / "bin/busybox")
    for applet in ("sh", "ls", "grep", "mkdir"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return tmp_path


def start_in(cgroup, node, script, env):
    """`berth start app sh -c SCRIPT` from the cgroup `cgroup`, as a step's
    task starts from its step's."""
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO / "runtime"),
            "ENROOT_SYSCONF_PATH": str(node / "sys"), "ENROOT_DATA_PATH": str(node / "data"),
            "ENROOT_RUNTIME_PATH": str(node / "run"), "ENROOT_CONFIG_PATH": str(node / "cfg"),
            "ENROOT_CACHE_PATH": str(node / "cache")}
    berth = [sys.executable, "-c", "import sys; from berth.cli import main; sys.exit(main())"]
    return subprocess.run(
        ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"),
         *berth, "start", "app", "sh", "-c", script],
        capture_output=True, text=True, env={**base, **env}, timeout=60, check=False)


def test_enroot_cgroups_hook_shows_the_container_its_jobs_cgroup(node, step_cgroup):
    """enroot's 10-cgroups.sh binds the job's cgroup (the step's parent,
    SLURM_STEP_ID set) over each controller's mount, read-only. Berth's own
    start binds the host's whole /sys, so the hook stays in hooks.d: run
    from a step's cgroup, the container sees its job's cgroup, its step
    below it (cgroup v2 here), none of the host's other cgroups, and cannot
    write there."""
    top, job = step_cgroup
    enroot_hook("10-cgroups.sh", node / "sys/hooks.d/10-cgroups.sh")
    inside = str(top)  # (the container's /sys is the host's)
    script = (f"ls {inside}; echo --; grep ' {inside} ' /proc/self/mountinfo; "
              f"mkdir {inside}/planted 2>/dev/null && echo wrote")
    result = start_in(job / "step_0", node, script, {"SLURM_STEP_ID": "0"})
    assert (result.returncode, result.stderr) == (1, "")  # (1: the mkdir's refusal)
    listed, mounted = result.stdout.split("--\n")
    assert "step_0" in listed.split() and job.name not in listed.split(), listed
    # (mountinfo: ID PARENT DEV ROOT MOUNTPOINT OPTIONS ...; the last mount there shows)
    root, _, options = mounted.splitlines()[-1].split()[3:6]
    assert (root, options.split(",")[0]) == (f"/{job.name}", "ro"), mounted
    assert not (job / "planted").exists()
