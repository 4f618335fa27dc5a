"""Issue #11, root never acts on a user's paths: the SPANK plugin's root
callbacks (task_exit, exit, job_epilog) against a hostile user on the real
cluster. Each test plays the user (alice) doing what any user can do to
their own files and processes, and checks that root did not follow."""

import re
import shlex
import time

from conftest import CONTROLLER, node

IMAGE_SQSH = "/opt/berth-images/mpi-test.sqsh"
NODE = "berth-cn1"
PLUGSTACK = "/etc/slurm/plugstack.conf.d/berth.conf"
SLURMD_LOG = "/var/log/slurm/slurmd.log"


def srun(args, user="alice", env=""):
    return node(CONTROLLER).run(f"runuser -u {user} -- env {env} srun {args}")


def uid(name="alice"):
    return node(NODE).check_output(f"id -u {name}")


def sbatch(command, user="alice"):
    """Submit `srun ... command` on NODE in the background; the job id."""
    job = node(CONTROLLER).run(
        f"cd /tmp && runuser -u {user} -- sbatch -w {NODE} -o /dev/null --wrap {shlex.quote(command)}")
    assert job.rc == 0, job.stderr
    return re.search(r"Submitted batch job (\d+)", job.stdout).group(1)


def wait_job_done(job_id, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = node(CONTROLLER).run(f"scontrol show job {job_id}").stdout
        found = re.search(r"JobState=(\S+)", state)
        if found and found.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return found.group(1), re.search(r"ExitCode=(\S+)", state).group(1)
        time.sleep(1)
    raise AssertionError(f"job {job_id} still not done after {timeout} s")


def keeper_pid(timeout=60):
    """The pid of alice's "berth start --detach" that a slurmstepd on NODE forked."""
    host = node(NODE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in host.run("ps -u alice -o pid=,ppid=,args=").stdout.splitlines():
            pid, ppid, args = line.split(None, 2)
            if "berth start --detach" in args and \
                    host.run(f"cat /proc/{ppid}/comm").stdout.strip() == "slurmstepd":
                return int(pid)
        time.sleep(0.5)
    raise AssertionError("no keeper came up on " + NODE)


def log_mark():
    """A position in slurmd's log on NODE: lines after it are this test's."""
    return int(node(NODE).check_output(f"wc -l < {SLURMD_LOG}"))


def log_since(mark):
    return node(NODE).check_output(f"tail -n +{mark + 1} {SLURMD_LOG}")


def remove_step_containers():
    """The containers a --container-save step made (pyxis_JOB.STEP) that its failed end left."""
    node(NODE).run("runuser -u alice -- berth list | grep -E '^pyxis_[0-9]+[.][0-9]+$' | "
                   "xargs -r runuser -u alice -- berth remove -f")


def can_lower_oom_score_adj():
    """CAP_SYS_RESOURCE (bit 24) in the node's bounding set."""
    bounding = node(NODE).check_output("awk '/^CapBnd/ {print $2}' /proc/1/status")
    return bool(int(bounding, 16) >> 24 & 1)


def sentinel_dir(path):
    """A directory only root can enter, with one file in it."""
    node(NODE).run(f"rm -rf {path} && install -d -m 0700 {path} && echo keep > {path}/file")


def test_step_dir_swapped_for_a_link_leaves_its_target_alone():
    host = node(NODE)
    sentinel_dir("/root/sentinel-dir")
    spank = f"/run/berth/{uid()}/spank"
    # the task sees the plugin's state dir through a bind mount, as the user
    swap = 'd=/mnt/$SLURM_JOB_ID.$SLURM_STEP_ID; rm -rf "$d" && ln -s /root/sentinel-dir "$d"'
    job = srun(f"-w {NODE} --container-image={IMAGE_SQSH} --container-mounts={spank}:/mnt "
               f"sh -c {shlex.quote(swap)}")
    assert job.rc == 0, job.stderr
    assert host.file("/root/sentinel-dir/file").content_string == "keep\n"
    # the link itself went, as the user: the step left nothing behind
    assert host.run(f"find {spank} -maxdepth 1 -type l").stdout.strip() == ""


def test_named_dir_swapped_for_a_link_keeps_roots_file_of_that_name():
    host = node(NODE)
    sentinel_dir("/root/sentinel-named")
    host.run("echo keep > /root/sentinel-named/pyxis_sec-named.pid")
    spank = f"/run/berth/{uid()}/spank"
    swap = "rm -rf /mnt/named && ln -s /root/sentinel-named /mnt/named"
    try:
        job = srun(f"-w {NODE} --container-image={IMAGE_SQSH} --container-name=sec-named "
                   f"--container-mounts={spank}:/mnt sh -c {shlex.quote(swap)}")
        assert job.rc == 0, job.stderr
        assert host.file("/root/sentinel-named/pyxis_sec-named.pid").content_string == "keep\n"
    finally:
        host.run(f"rm -f {spank}/named && runuser -u alice -- berth remove -f pyxis_sec-named")


def test_a_failed_commands_log_is_read_as_the_user():
    """The runtime (here a mksquashfs in the user's PATH) swaps the step dir for a
    link to a root-only dir holding export.log: root must not print its line."""
    host = node(NODE)
    sentinel_dir("/root/sentinel-log")
    host.run("echo TOP-SECRET-LINE > /root/sentinel-log/export.log")
    host.run("install -d -m 0755 /opt/hostile && printf '%s\\n' '#!/bin/sh' "
             "'d=$(pwd -P); mv \"$d\" \"$d.moved\" && ln -s /root/sentinel-log \"$d\"; exit 1' "
             "> /opt/hostile/mksquashfs && chmod 0755 /opt/hostile/mksquashfs")
    mark = log_mark()
    try:
        job = srun(f"-w {NODE} --container-image={IMAGE_SQSH} --container-save=/tmp/sec-log.sqsh true",
                   env="PATH=/opt/hostile:/usr/local/bin:/usr/bin:/bin")
        assert "TOP-SECRET-LINE" not in job.stdout + job.stderr
        assert "TOP-SECRET-LINE" not in log_since(mark)
        assert "berth export" in job.stderr + log_since(mark)
    finally:
        host.run(f"rm -rf /opt/hostile /run/berth/{uid()}/spank/*.moved; "
                 f"find /run/berth/{uid()}/spank -maxdepth 1 -type l -delete")
        remove_step_containers()


def test_keeper_killed_by_the_user_is_never_signalled_through_a_reused_pid():
    """alice kills her keeper; slurmstepd reaps it; a root process then gets its
    pid (clone3 with set_tid plays the pid wrap-around). At step end the plugin
    must not signal that process, and the step ends cleanly."""
    host = node(NODE)
    decoy_src = r"""
#define _GNU_SOURCE
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    pid_t want = atoi(argv[1]);
    struct clone_args args = { .exit_signal = SIGCHLD, .set_tid = (uint64_t)(uintptr_t)&want,
                               .set_tid_size = 1 };
    long pid = syscall(SYS_clone3, &args, sizeof(args));
    if (pid == 0) {
        setsid();
        execl("/bin/sleep", "sleep", "300", (char *)NULL);
        _exit(127);
    }
    if (pid < 0) { perror("clone3"); return 1; }
    printf("%ld\n", pid);
    return 0;
}
"""
    host.run(f"printf '%s' {shlex.quote(decoy_src)} > /root/decoy.c && "
             "gcc -O1 -o /root/decoy /root/decoy.c")
    assert host.file("/root/decoy").exists
    mark = log_mark()
    job_id = sbatch(f"srun --container-image={IMAGE_SQSH} sleep 20")
    decoy = None
    try:
        keeper = keeper_pid()
        host.run(f"runuser -u alice -- kill -9 {keeper}")
        deadline = time.monotonic() + 10
        while host.file(f"/proc/{keeper}").exists and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not host.file(f"/proc/{keeper}").exists, "slurmstepd did not reap the keeper"
        made = host.run(f"/root/decoy {keeper} </dev/null >/root/decoy.pid 2>&1")
        assert made.rc == 0, host.file("/root/decoy.pid").content_string
        decoy = keeper
        state, code = wait_job_done(job_id)
        assert host.run(f"cat /proc/{decoy}/comm").stdout.strip() == "sleep", \
            "the plugin killed the process that got the keeper's pid"
        # the step ends (its image's FUSE server died with the keeper: the
        # task may fail with SIGBUS, that is the user's doing) and leaves nothing
        assert state in ("COMPLETED", "FAILED"), (state, code)
        assert "sending SIGTERM" not in log_since(mark)
        assert host.run("pgrep -u alice").rc == 1
        assert not host.file(f"/run/berth/{uid()}/spank/{job_id}.0").exists
    finally:
        if decoy and host.run(f"cat /proc/{decoy}/comm").stdout.strip() == "sleep":
            host.run(f"kill {decoy}")
        host.run(f"scancel {job_id}")


def test_keeper_that_ignores_eof_is_stopped_through_its_pidfd():
    host = node(NODE)
    mark = log_mark()
    job_id = sbatch(f"srun --container-image={IMAGE_SQSH} sleep 3")
    keeper = keeper_pid()
    # stopped once its task runs: a keeper stopped before it is ready holds
    # only its own step (the plugin still waits for its pid line)
    host.run("for i in $(seq 120); do pgrep -u alice -x sleep >/dev/null && break; "
             "sleep 0.25; done")
    host.run(f"runuser -u alice -- kill -STOP {keeper}")
    state, code = wait_job_done(job_id, timeout=90)
    assert (state, code) == ("COMPLETED", "0:0")
    assert f"container keeper {keeper} ignored EOF, sending SIGTERM" in log_since(mark)
    assert not host.file(f"/proc/{keeper}").exists
    assert host.run("pgrep -u alice -f 'berth start'").rc == 1


def test_stalled_export_is_bounded_by_cleanup_timeout():
    """--container-save runs mksquashfs from the user's PATH: a user can stall it.
    Root kills the command's process group after cleanup_timeout seconds."""
    host = node(NODE)
    host.run("install -d -m 0755 /opt/stall && printf '%s\\n' '#!/bin/sh' "
             "'echo $$ > /tmp/stall.pid; exec sleep 3600' > /opt/stall/mksquashfs && "
             "chmod 0755 /opt/stall/mksquashfs && rm -f /tmp/stall.pid")
    host.run(f"cp {PLUGSTACK} /root/berth.conf.orig && "
             f"sed -i '/spank_berth.so/ s/$/ cleanup_timeout=10/' {PLUGSTACK}")
    mark = log_mark()
    try:
        started = time.monotonic()
        job = srun(f"-w {NODE} --container-image={IMAGE_SQSH} --container-save=/tmp/stall.sqsh true",
                   env="PATH=/opt/stall:/usr/local/bin:/usr/bin:/bin timeout 150")
        took = time.monotonic() - started
        assert job.rc != 124, "the step did not end: the stalled export was waited for"
        assert took < 60, f"the step took {took:.0f} s"
        said = job.stderr + log_since(mark)
        assert "berth export timed out after 10 s" in said, said
        stalled = host.check_output("cat /tmp/stall.pid")
        assert not host.file(f"/proc/{stalled}").exists, "the stalled command was left running"
    finally:
        host.run(f"cp /root/berth.conf.orig {PLUGSTACK}")
        pid = host.run("cat /tmp/stall.pid").stdout.strip()
        if pid and host.run(f"cat /proc/{pid}/comm").stdout.strip() == "sleep":
            host.run(f"kill {pid}")
        host.run("rm -rf /opt/stall /tmp/stall.pid /tmp/stall.sqsh*")
        remove_step_containers()


def test_keeper_starts_with_oom_score_adj_zero_whatever_slurmstepd_has():
    """A site's SLURMSTEPD_OOM_ADJ is slurmstepd's own: the keeper and the
    container must not inherit it (Slurm resets tasks to 0 too)."""
    host = node(NODE)
    dropin = "/etc/systemd/system/slurmd.service.d/berth-test-oom.conf"
    # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which these node containers
    # lack: a negative value does not take here, so a positive one stands in
    # (slurmstepd's, inherited by whatever it forks, as a negative one would be).
    adj = -1000 if can_lower_oom_score_adj() else 500
    host.run(f"install -d {dropin.rsplit('/', 1)[0]} && printf '%s\\n' '[Service]' "
             f"'Environment=SLURMSTEPD_OOM_ADJ={adj}' > {dropin}")
    host.run("systemctl daemon-reload && systemctl restart slurmd")
    try:
        time.sleep(2)
        job_id = sbatch(f"srun --container-image={IMAGE_SQSH} sleep 15")
        keeper = keeper_pid()
        stepd = host.check_output(f"cat /proc/{keeper}/status | awk '/^PPid/ {{print $2}}'")
        assert host.check_output(f"cat /proc/{stepd}/oom_score_adj") == str(adj)
        assert host.check_output(f"cat /proc/{keeper}/oom_score_adj") == "0"
        for child in host.run(f"pgrep -P {keeper}").stdout.split():
            assert host.check_output(f"cat /proc/{child}/oom_score_adj") == "0"
        assert wait_job_done(job_id) == ("COMPLETED", "0:0")
    finally:
        host.run(f"rm -f {dropin} && systemctl daemon-reload && systemctl restart slurmd")
        time.sleep(2)
