"""Container verbs end to end, in real namespaces, as an unprivileged user.

Run as root (as CI does), the tests create the user `berthtest` and run
`berth` through `runuser` from a world-readable copy of the package; run as
another user, they run `berth` as that user. The image is a busybox root
(Debian's busybox-static) squashed in a few milliseconds; container_fixture.py makes
them and the runner.
"""

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from container_fixture import AS_ROOT, berth_pid, pids_of, start_detached

# create / list / remove ---------------------------------------------------

def test_create_list_remove(berth, images):
    berth.ok("create", images / "app.sqsh")
    assert (berth.base / "data/app/bin/busybox").is_file()
    assert os.stat(berth.base / "data/app").st_uid == berth.user.pw_uid
    berth.ok("create", "-n", "second", images / "plain.sqsh")
    assert berth.ok("list").split() == ["app", "second"]
    fancy = berth.ok("list", "--fancy").splitlines()
    assert fancy[0].split() == ["NAME", "PID", "COMM", "STATE", "STARTED", "TIME", "MNTNS",
                                "USERNS", "COMMAND"]
    assert fancy[1:] == ["app", "second"]  # stopped: the name alone
    berth.fails("create", images / "plain.sqsh", "-n", "app", needle="'app' already exists")
    assert (berth.base / "data/app/etc/rc").exists()  # not replaced
    berth.ok("create", "-f", "-n", "app", images / "plain.sqsh")
    assert not (berth.base / "data/app/etc/rc").exists()  # replaced
    berth.ok("remove", "app", "second")
    assert berth.ok("list") == ""
    berth.fails("remove", "app", needle="no container named 'app'")
    berth.fails("remove", "-f", "app", needle="no container named 'app'")  # as enroot
    assert berth.leftovers() == []


@pytest.mark.parametrize("args, needle", [
    (["missing.sqsh"], "missing.sqsh: No such file"),
    (["{images}/not-an-image.sqsh"], "not-an-image.sqsh: not a squashfs or SIF image"),
    (["{images}"], "is a directory"),
    (["docker://ubuntu"], "docker://ubuntu: No such file"),
    (["-n", "x", ""], "berth: error: '': an empty path is no image file"),
    (["-n", "", "{images}/app.sqsh"], "invalid container name ''"),
    (["-n", ".hidden", "{images}/app.sqsh"], "invalid container name '.hidden'"),
    (["-n", "a/b", "{images}/app.sqsh"], "invalid container name 'a/b'"),
    (["-n", "x.sqsh", "{images}/app.sqsh"], "invalid container name 'x.sqsh'"),
])
def test_create_refuses_bad_input(berth, images, args, needle):
    berth.fails("create", *(a.format(images=images) for a in args), needle=needle)
    assert list((berth.base / "data").iterdir()) == []


def test_remove_refuses_bad_name_before_removing_anything(berth, app):
    berth.fails("remove", "app", "nope", needle="no container named 'nope'")
    assert app.is_dir()


# start ----------------------------------------------------------------------

def test_exit_status_and_signals_pass_through(berth, app):
    assert berth("start", "app", "sh", "-c", "exit 7").returncode == 7
    assert berth("start", "app", "sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM
    assert berth.leftovers() == []


def test_command_is_resolved_inside_the_image(berth, app):
    assert berth.ok("start", "app", "only-in-image", "a") == "inside a\n"
    result = berth("start", "app", "no-such-command")
    assert result.returncode == 127 and "no-such-command" in result.stderr


def test_rc_runs_in_workdir_with_entrypoint_semantics(berth, app, images):
    assert berth.ok("start", "app", "pwd") == "/work\n"
    assert berth.ok("start", "app", input="echo from-default-shell\n") == "from-default-shell\n"
    berth.ok("create", images / "plain.sqsh")
    assert berth.ok("start", "plain", "pwd") == "/\n"  # no config, no /etc/rc
    rc = berth.write("my.rc", 'echo "rc got $*"\n')
    assert berth.ok("start", "--rc", rc, "app", "x", "y") == "rc got x y\n"


def test_environment_precedence(berth, app):
    berth.write("sys/environ.d/10-site.env", "FOO=sys\nSITE=sys\nLEVEL=sys\n")
    berth.write("cfg/environ.d/10-me.env", "# mine\nLEVEL=user\nPATH=${PATH}:/opt/me\n")
    out = berth.ok("start", "-e", "BAR=cli", "-e", "FROM_CALLER", "-e", "UNSET_HERE",
                   "app", "env", env={"FROM_CALLER": "caller", "NOT_PASSED": "x"})
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["FOO"] == "image"          # image beats environ.d
    assert env["BAR"] == "cli"            # -e beats the image
    assert env["SITE"] == "sys" and env["LEVEL"] == "user"
    assert env["PATH"] == "/usr/local/bin:/bin"  # the image's, set after environ.d
    assert env["FROM_CALLER"] == "caller"
    assert "NOT_PASSED" not in env and "UNSET_HERE" not in env
    berth.fails("start", "-e", "1BAD=x", "app", "true", needle="-e 1BAD=x")
    berth.write("cfg/environ.d/20-bad.env", "no equals sign\n")
    berth.fails("start", "app", "true", needle="20-bad.env:1")


def test_open_file_descriptors_survive(berth, app):
    read_end, write_end = os.pipe()
    result = berth("start", "app", "sh", "-c", f'echo "PMI via fd $PMI_FD" >&{write_end}',
                   env={"PMI_FD": str(write_end)}, pass_fds=(write_end,))
    os.close(write_end)
    with os.fdopen(read_end) as f:
        assert f.read() == "PMI via fd \n"  # the fd survives; the variable needs -e
    assert result.returncode == 0, result.stderr
    read_end, write_end = os.pipe()
    result = berth("start", "-e", "PMI_FD", "app", "sh", "-c", 'echo "fd $PMI_FD" >&$PMI_FD',
                   env={"PMI_FD": str(write_end)}, pass_fds=(write_end,))
    os.close(write_end)
    with os.fdopen(read_end) as f:
        assert f.read() == f"fd {write_end}\n"
    assert result.returncode == 0, result.stderr


def test_root_is_read_only_unless_rw(berth, app):
    result = berth("start", "app", "touch", "/made")
    assert result.returncode == 1 and "Read-only file system" in result.stderr
    berth.ok("start", "--rw", "app", "touch", "/made")
    assert (app / "made").exists()
    berth.ok("start", "app", "touch", "/tmp/bctr-host-tmp-probe")  # /tmp is the host's
    os.unlink("/tmp/bctr-host-tmp-probe")
    berth.ok("start", "app", "true", env={"ENROOT_ROOTFS_WRITABLE": "yes"})


def test_mounts_from_options_and_fstab(berth, app):
    host = berth.base / "host"
    (host / "in").write_text("from host\n")
    berth.chown(host)
    out = berth.ok("start", "-m", f"{host}:/mnt/data:ro+nosuid", "app",
                   "sh", "-c", "cat /mnt/data/in; touch /mnt/data/x || echo refused")
    assert out.startswith("from host\n") and out.endswith("refused\n")
    berth.ok("start", "-m", f"{host}:/mnt/data", "app", "touch", "/mnt/data/written")
    assert (host / "written").stat().st_uid == berth.user.pw_uid
    berth.write("sys/mounts.d/10-site.fstab", f"# site\n{host} /site none bind,x-create=dir\n")
    berth.write("cfg/mounts.d/10-me.fstab", "tmpfs /scratch tmpfs x-create=dir,size=1m\n"
                "/does/not/exist /nothing none bind,nofail\n")
    out = berth.ok("start", "app", "sh", "-c", "cat /site/in; grep -c ' /scratch ' /proc/mounts")
    assert out == "from host\n1\n"


@pytest.mark.parametrize("spec, needle", [
    ("{host}:../up", "-m {host}:../up: mount destination ../up escapes the container root: "
     "Invalid cross-device link"),
    ("{host}:a/../../up", "-m {host}:a/../../up: mount destination a/../../up escapes the"),
    ("{host}:/x:ro:extra", "-m {host}:/x:ro:extra: expected SRC[:DST[:FLAGS]]"),
    (":/x", "-m :/x: expected SRC[:DST[:FLAGS]]"),
    ("{host}:/x:ro+bogus", "unknown mount flag 'bogus'"),
    ("/no/such/dir:/x", "-m /no/such/dir:/x: mount source path does not exist: /no/such/dir"),
])
def test_bad_mount_specs_are_refused(berth, app, spec, needle):
    host = berth.base / "host"
    berth.fails("start", "-m", spec.format(host=host), "app", "true",
                needle=needle.format(host=host))


def test_a_relative_destination_is_taken_from_the_containers_root(berth, app):
    # as enroot and pyxis take one: accepted, resolved inside the root when
    # mounted (an escape is refused then: test_bad_mount_specs_are_refused)
    host = berth.base / "host"
    (host / "in").write_text("from host\n")
    berth.chown(host)
    out = berth.ok("start", "-m", f"{host}:data/inside", "-m", f"{host}:./x/../y", "app",
                   "sh", "-c", "cat /data/inside/in /y/in")
    assert out == "from host\nfrom host\n"
    berth.write("cfg/mounts.d/50-rel.fstab", f"{host} site none bind,x-create=dir\n")
    assert berth.ok("start", "app", "cat", "/site/in") == "from host\n"


def test_bad_fstab_line_names_file_and_line(berth, app):
    berth.write("cfg/mounts.d/50-bad.fstab", "# ok\n/tmp ../relative none bind\n")
    berth.fails("start", "app", "true",
                needle="50-bad.fstab:2: mount destination ../relative escapes the container root")
    berth.write("cfg/mounts.d/50-bad.fstab", "/tmp /x\n")
    berth.fails("start", "app", "true", needle="50-bad.fstab:1: expected 'SRC DST TYPE")
    berth.write("cfg/mounts.d/50-bad.fstab", "/tmp /x none bind\n")  # no x-create
    berth.fails("start", "app", "true", needle="50-bad.fstab:1: mount destination /x does not")


def test_remap_root(berth, app):
    host = berth.base / "host"
    out = berth.ok("start", "--root", "-m", f"{host}:/mnt", "app",
                   "sh", "-c", "id -u; touch /mnt/by-root")
    assert out == "0\n"
    assert (host / "by-root").stat().st_uid == berth.user.pw_uid
    assert berth.ok("start", "app", "id", "-u", env={"ENROOT_REMAP_ROOT": "yes"}) == "0\n"
    assert berth.ok("start", "app", "id", "-u") == f"{berth.user.pw_uid}\n"


@pytest.mark.skipif(not AS_ROOT, reason="needs root")
def test_root_caller_stays_in_a_user_namespace(berth, app):
    # root's own directories: a user's are refused to root (safedir)
    for d in ("data", "run", "cfg"):
        subprocess.run(["chown", "-hR", "0:0", str(berth.base / d)], check=True)
    os.chown(berth.base, 0, 0)

    def uid_map(extra_env):
        result = subprocess.run(
            ["/usr/bin/python3", "-m", "berth.cli", "start", "app", "cat", "/proc/self/uid_map"],
            env={**berth.env, **extra_env}, capture_output=True, text=True, check=True)
        return result.stdout.split()
    assert uid_map({}) == ["0", "0", "1"]
    assert uid_map({"ENROOT_ALLOW_SUPERUSER": "yes"}) == ["0", "0", "4294967295"]


def test_unshare_pid_net_uts(berth, app):
    assert berth.ok("start", "--pid", "app", "sh", "-c", "echo $$") == "1\n"
    assert berth.ok("start", "--net", "app", "ls", "/sys/class/net").split() == ["lo"]
    links = berth.ok("start", "--net", "app", "cat", "/proc/net/dev").splitlines()[2:]
    assert [line.split(":")[0].strip() for line in links] == ["lo"]
    # its loopback is up, as enroot's: a closed port refuses; nothing else is reachable
    tried = berth("start", "--net", "app", "sh", "-c",
                  "nc 127.0.0.1 9 </dev/null; nc 192.0.2.1 9 </dev/null")
    assert "127.0.0.1): Connection refused" in tried.stderr, tried.stderr
    assert "192.0.2.1): Network is unreachable" in tried.stderr, tried.stderr
    hostname = berth.ok("start", "--uts", "--root", "app", "sh", "-c", "hostname in && hostname")
    assert hostname == "in\n"


def test_unknown_container_and_missing_image(berth):
    berth.fails("start", "nope", "true", needle="no container named 'nope'")
    berth.fails("start", "/no/such.sqsh", "true", needle="/no/such.sqsh: No such file")


# start IMAGE.sqsh without unpacking ----------------------------------------

def test_start_image_directly(berth, images):
    image = images / "app.sqsh"
    assert berth.ok("start", image, "sh", "-c", "pwd; echo $FOO") == "/work\nimage\n"
    result = berth("start", image, "touch", "/made")
    assert result.returncode == 1 and "Read-only file system" in result.stderr
    assert berth.ok("start", "--rw", image, "sh", "-c", "touch /made && ls /made") == "/made\n"
    assert berth("start", image, "ls", "/made").returncode == 1  # the overlay was private
    host = berth.base / "host"
    (host / "in").write_text("mounted\n")
    # Mount points the image lacks, even under its root-owned dirs, and files
    # it owns as root appear as the caller's (as in an unpacked container).
    out = berth.ok("start", "-m", f"{host}:/usr/local/new/dir:ro", image,
                   "sh", "-c", "cat /usr/local/new/dir/in; stat -c %u /bin/busybox")
    assert out == f"mounted\n{berth.user.pw_uid}\n"
    assert list((berth.base / "data").iterdir()) == []  # nothing unpacked
    assert berth.leftovers() == []
    servers = subprocess.run(["pgrep", "-u", str(berth.user.pw_uid), "squashfuse"],
                             capture_output=True, text=True).stdout
    assert servers == ""


def _children(pid):
    return [int(child) for task in os.listdir(f"/proc/{pid}/task")
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]


@pytest.mark.parametrize("detach", [False, True])
def test_a_killed_squashfs_server_stops_the_start_in_one_line(berth, images, detach):
    """The root's FUSE server killed mid-job: the reads fail at once, and the
    start ends in one line naming the image, nothing left mounted or running."""
    image = images / "app.sqsh"
    ready = berth.base / "host" / "ready"
    # it would read (and fail) forever: only berth's stop ends it
    loop = "exec 2>/dev/null; touch /host/ready; while :; do cat /bin/busybox >/dev/null; done"
    args = ["--detach"] if detach else []
    args += ["-m", f"{berth.base / 'host'}:/host", image, *([] if detach else ["sh", "-c", loop])]
    process = subprocess.Popen(berth.command("start", *args), env=berth.env, cwd=berth.base,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    task = None
    try:
        if detach:  # a job's task, joined as the SPANK plugin joins it
            task = subprocess.Popen(berth.command("exec", process.stdout.readline().strip(),
                                                  "sh", "-c", loop), env=berth.env)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
            time.sleep(0.05)
        servers = [pid for pid in _children(berth_pid(process))
                   if Path(f"/proc/{pid}/comm").read_text().startswith("squashfuse")
                   and str(image).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(servers) == 1, servers
        os.kill(servers[0], signal.SIGKILL)
        killed = time.monotonic()
        process.wait(timeout=20)  # (stdin stays open: its end would stop a --detach start)
        took = time.monotonic() - killed
        stderr = process.stderr.read()
    finally:
        if task:  # the joined task (below runuser as root) loops on until killed
            with contextlib.suppress(ProcessLookupError, IndexError):
                os.kill(berth_pid(task), signal.SIGKILL)
            task.wait()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
    assert process.returncode == 1 and took < 5, (process.returncode, took, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0] == (f"berth: error: {image} at /: its FUSE server (pid {servers[0]}) "
                        "was killed by signal 9; the container was stopped"), lines[0]
    assert berth.leftovers() == []
    assert str(berth.base) not in Path("/proc/self/mountinfo").read_text()
    assert subprocess.run(["pgrep", "-u", str(berth.user.pw_uid), "squashfuse"],
                          capture_output=True, text=True).stdout == ""


@pytest.mark.parametrize("native, fstype", [("yes", "overlay"), ("no", "fuse.fuse-overlayfs")])
def test_native_overlayfs_no_takes_fuse_overlayfs_as_enroot_does(berth, images, native, fstype):
    # (a read-only start: a writable one unpacks the image, BERTH_WRITABLE_IMAGE)
    out = berth.ok("start", images / "app.sqsh", "awk",
                   '$5 == "/" { for (i = 7; $i != "-"; i++); print $(i + 1) }',
                   "/proc/self/mountinfo", env={"ENROOT_NATIVE_OVERLAYFS": native})
    assert out.split() == [fstype]
    assert berth.leftovers() == []


# A ',' or ':' in a directory named in overlay's options split them:
# fuse-overlayfs took `x=y` for options ("unknown argument ignored"), then
# failed ("Transport endpoint is not connected").
@pytest.mark.parametrize("native", ["yes", "no"])
def test_overlay_options_never_split_at_a_paths_comma_or_colon(berth, images, native):
    odd = berth.base / "co:lon,x=y"
    berth.fails("start", images / "app.sqsh", "true",
                env={"ENROOT_NATIVE_OVERLAYFS": native, "ENROOT_RUNTIME_PATH": str(odd)},
                needle=f"ENROOT_RUNTIME_PATH {odd}: a path with ',', ':' or '\\' cannot be")
    assert not odd.exists()
    named = berth.base / "a,b:c\\d.sqsh"  # the start's directory is named after it
    shutil.copy(images / "app.sqsh", named)
    berth.chown(named)
    assert berth.ok("start", named, "echo", "ok", env={"ENROOT_NATIVE_OVERLAYFS": native}) == "ok\n"
    assert berth.leftovers() == []


@pytest.mark.skipif(not AS_ROOT, reason="mounts over /dev/fuse")
def test_image_start_says_when_fuse_is_unusable(berth, images):
    """/dev/fuse at 0600 in a mount namespace of this start's own (a root-owned
    0600 file bound over it): the machine's /dev/fuse, which tests on the other
    worker use, keeps its mode."""
    private = berth.base / "fuse-0600"
    private.write_text("")
    private.chmod(0o600)
    berth.command = lambda *args, _command=berth.command: [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$0" /dev/fuse && exec "$@"', str(private), *_command(*args)]
    berth.fails("start", images / "app.sqsh", "true", needle="/dev/fuse is not usable")
    assert stat.S_IMODE(os.stat("/dev/fuse").st_mode) == 0o666


# --detach and exec ------------------------------------------------------------

@pytest.mark.parametrize("container", ["app", "image"])
def test_detach_then_exec(berth, app, images, container):
    target = images / "app.sqsh" if container == "image" else container
    process, pid = start_detached(berth, "-e", "BAR=cli", target)
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"FOO=image" in environ and b"BAR=cli" in environ
        assert os.readlink(f"/proc/{pid}/cwd") == "/work"
        out = berth("exec", pid, "sh", "-c", "echo $FOO $BAR; pwd; id -u; exit 5")
        assert out.returncode == 5 and out.stdout == f"image cli\n/work\n{berth.user.pw_uid}\n"
        berth.ok("exec", pid, "touch", "/tmp/../work/../tmp/bctr-exec-probe")
        os.unlink("/tmp/bctr-exec-probe")
        if container == "app":
            assert berth.ok("list", "-f").splitlines()[1].split()[1] == str(pid)
    finally:
        process.stdin.close()  # end of stdin stops the container
        assert process.wait(timeout=10) == 0
    assert not os.path.exists(f"/proc/{pid}")
    assert berth.leftovers() == []


def test_detach_stops_on_sigterm_and_remove_waits_for_it(berth, app):
    process, pid = start_detached(berth, "--pid", "--net", "app")
    try:
        assert berth.ok("exec", pid, "sh", "-c", "echo $$") != "1\n"  # a child of pid 1
        assert berth.ok("exec", pid, "ls", "/sys/class/net").split() == ["lo"]  # its net ns
        line = berth("remove", "app")
        assert line.returncode == 1 and "is running" in line.stderr
        assert app.is_dir()
    finally:
        os.kill(berth_pid(process), signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    assert not os.path.exists(f"/proc/{pid}")
    berth.ok("remove", "app")


@pytest.mark.parametrize("namespaces", [[], ["--pid"]])
def test_detach_keeper_ends_with_berth_even_killed(berth, app, namespaces):
    """berth SIGKILLed tears nothing down, yet its keeper (pid 1 with --pid) must not stay."""
    process, pid = start_detached(berth, *namespaces, "app")
    os.kill(berth_pid(process), signal.SIGKILL)
    process.wait(timeout=10)
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"keeper {pid} still running after berth was killed")


def test_detach_stopped_during_setup_leaves_nothing(berth, app):
    marker = berth.base / "host/hook-started"
    berth.write("cfg/hooks.d/50-slow.sh",
                f"#!/bin/sh\ntouch {marker}\nexec sleep 5 >/dev/null 2>&1\n", mode=0o755)
    process = subprocess.Popen(berth.command("start", "--detach", "app"), env=berth.env,
                               cwd=berth.base, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if marker.exists():
            break
        time.sleep(0.05)
    os.kill(berth_pid(process), signal.SIGTERM)
    out, _ = process.communicate(timeout=10)
    assert process.returncode != 0 and out == ""
    assert berth.leftovers() == []


def test_detach_needs_a_shell_in_the_image(berth, app):
    (app / "bin/sh").unlink()  # the keeper is the image's /bin/sh, as pyxis's is
    result = berth("start", "--detach", "app")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "berth: error: /bin/sh (the keeper of --detach): No such file or directory "
        "in the container")
    assert berth.leftovers() == []


def test_detach_setup_failure_prints_no_pid(berth, app):
    result = berth("start", "--detach", "-m", "/no/such:/x", "app")
    assert result.returncode == 1 and result.stdout == "" and "/no/such" in result.stderr


@pytest.fixture
def entrypoint_app(berth, app):
    """`app` whose image entrypoint is SCRIPT: `berth.entrypoint(SCRIPT)`."""
    config = json.loads((app / "etc/berth/image.json").read_text())

    def set_entrypoint(script):
        berth.write("data/app/usr/local/bin/entry", f"#!/bin/sh\n{script}", mode=0o755)
        config["entrypoint"] = ["/usr/local/bin/entry"]
        berth.write("data/app/etc/berth/image.json", json.dumps(config))
    berth.entrypoint = set_entrypoint
    set_entrypoint('echo "entrypoint got $1"\nexport FROM_ENTRYPOINT=yes\nexec "$@"\n')
    return app


def test_entrypoint_only_when_asked(berth, entrypoint_app):
    assert berth.ok("start", "app", "echo", "hi") == "hi\n"  # enroot: the command alone
    out = berth.ok("start", "--entrypoint", "app", "sh", "-c", "echo $FROM_ENTRYPOINT")
    assert out == "entrypoint got sh\nyes\n"


def test_detached_entrypoint_sets_the_container_environment(berth, entrypoint_app):
    process, pid = start_detached(berth, "--entrypoint", "app")
    try:
        assert b"FROM_ENTRYPOINT=yes" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert berth.ok("exec", pid, "sh", "-c", "echo $FROM_ENTRYPOINT") == "yes\n"
    finally:
        process.stdin.close()
        assert process.wait(timeout=10) == 0
    assert "entrypoint got /bin/sh" in process.stderr.read()  # its output: on stderr
    assert not os.path.exists(f"/proc/{pid}")
    assert berth.leftovers() == []


@pytest.mark.parametrize("script, needle", [
    ("exit 0\n", 'exited; it must end with exec "$@"'),
    ("exec sleep 30\n", "did not run its arguments within 1 s"),
])
def test_detached_entrypoint_that_never_execs_fails_cleanly(berth, entrypoint_app, script,
                                                            needle):
    berth.entrypoint(script)
    result = berth("start", "--detach", "--entrypoint", "app",
                   env={"BERTH_ENTRYPOINT_TIMEOUT": "1"})
    assert result.returncode == 1 and result.stdout == ""
    assert needle in result.stderr.strip().splitlines()[-1]
    assert berth.leftovers() == []


# '²' passed str.isdigit() and failed int() (a traceback); 10**20 overflowed
# signal.alarm (a traceback).
@pytest.mark.parametrize("value, why", [("0", "expected 1 or more"),
                                        ("\u00b2", "expected a number"),
                                        ("99999999999999999999", "expected at most 86400")])
def test_entrypoint_timeout_is_checked_first(berth, entrypoint_app, value, why):
    berth.fails("start", "--detach", "--entrypoint", "app", env={"BERTH_ENTRYPOINT_TIMEOUT": value},
                needle=f"BERTH_ENTRYPOINT_TIMEOUT: {why}, got '{value}'")


# ENROOT_LOGIN_SHELL ----------------------------------------------------------

PROFILE = 'export FROM_PROFILE=yes\nPATH=/profile-bin:$PATH\n'


@pytest.mark.parametrize("container", ["app", "plain"])  # through /etc/rc, and without one
def test_the_command_starts_through_a_login_shell_as_enroots_does(berth, app, images,
                                                                  container):
    if container == "plain":
        berth.ok("create", images / "plain.sqsh")
    (berth.base / f"data/{container}/etc/profile").write_text(PROFILE)
    probe = ["sh", "-c", 'echo "$FROM_PROFILE $PATH"']
    assert berth.ok("start", container, *probe).startswith("yes /profile-bin:/")
    # what the profile sets wins over -e, as under enroot (it runs last)
    assert berth.ok("start", "-e", "FROM_PROFILE=cli", container, *probe).startswith("yes ")
    # $SHELL is the login shell where the image has it (busybox's true ends it at once)
    assert berth.ok("start", "-e", "SHELL=/bin/true", container, *probe) == ""
    assert berth.ok("start", "-e", "SHELL=/no/such", container, *probe).startswith("yes ")
    for off in ("no", "n", "false", "0"):
        out = berth.ok("start", container, *probe, env={"ENROOT_LOGIN_SHELL": off})
        assert len(out.split()) == 1 and "/profile-bin" not in out
    assert berth.ok("start", container, "true") == ""  # exit statuses pass through it
    assert berth("start", container, "sh", "-c", "exit 7").returncode == 7
    result = berth("start", container, "no-such-command")
    assert result.returncode == 127 and "no-such-command" in result.stderr
    assert berth.leftovers() == []


def test_a_detached_containers_environment_is_its_login_shells(berth, app):
    """The keeper's environment is what a Slurm step's tasks get (pyxis takes
    the same from enroot's login shell)."""
    (app / "etc/profile").write_text(PROFILE)
    for setting, expected in (("yes", b"FROM_PROFILE=yes"), ("no", None)):
        process, pid = start_detached(berth, "app", env={"ENROOT_LOGIN_SHELL": setting})
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert (expected in environ) if expected else not any(
                e.startswith(b"FROM_PROFILE=") for e in environ)
            assert berth.ok("exec", pid, "sh", "-c", "echo $FOO") == "image\n"
        finally:
            process.stdin.close()
            assert process.wait(timeout=10) == 0
        assert berth.leftovers() == []


@pytest.mark.parametrize("profile, needle", [
    ("exit 3\n", "keeper shell exited (in the login shell's profile: ENROOT_LOGIN_SHELL=no"),
    ("sleep 31\n", "the login shell's profile has not finished after 1 s"),
    ("exec sleep 32\n", "the login shell's profile has not finished after 1 s"),
])
def test_a_profile_that_never_runs_the_keeper_fails_the_start_within_its_bound(
        berth, app, profile, needle):
    (app / "etc/profile").write_text(profile)
    result = berth("start", "--detach", "app", env={"BERTH_ENTRYPOINT_TIMEOUT": "1"})
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("berth: error:") and needle in lines[0], lines
    assert berth.leftovers() == []
    assert pids_of(berth.user.pw_uid, profile.strip()) == []  # what it started went too
    # a site (or the job) that turns it off starts the same image
    process, pid = start_detached(berth, "app", env={"ENROOT_LOGIN_SHELL": "no"})
    process.stdin.close()
    assert process.wait(timeout=10) == 0


def test_an_image_without_a_shell_starts_without_a_login_shell(berth, app):
    (app / "bin/sh").unlink()
    (app / "etc/rc").unlink()
    assert berth.ok("start", "app", "/bin/busybox", "echo", "no shell") == "no shell\n"


def test_a_bad_login_shell_setting_is_one_line(berth, app):
    berth.fails("start", "app", "true", env={"ENROOT_LOGIN_SHELL": "/bin/bash"},
                needle="ENROOT_LOGIN_SHELL: expected yes or no, got '/bin/bash'")


def test_exec_refuses_bad_pid(berth):
    berth.fails("exec", "999999999", "true", needle="no process with pid 999999999")


# export and batch --------------------------------------------------------------

def test_export_round_trip(berth, app):
    berth.ok("start", "--rw", "app", "sh", "-c", "echo changed > /work/note")
    berth.ok("export", "-o", "out.sqsh", "app")
    out = berth.base / "out.sqsh"
    berth.fails("export", "-o", "out.sqsh", "app", needle="out.sqsh already exists")
    berth.ok("export", "-f", "-o", "out.sqsh", "app")
    berth.fails("export", "nope", needle="no container named 'nope'")
    assert [p.name for p in berth.base.iterdir() if p.name.startswith(".")] == []
    berth.ok("create", "-n", "copy", out)
    assert berth.ok("start", "copy", "cat", "/work/note") == "changed\n"


def test_batch_file(berth, app, images):
    host = berth.base / "host"
    batch = berth.write("job.batch", f"""#!/bin/sh
#ENROOT_ROOTFS=app
#ENROOT_ROOTFS_WRITABLE=yes
#ENROOT_ENVIRON GREETING=hello
#ENROOT_MOUNTS {host} /mnt/host none bind,x-create=dir
touch /batch-was-here
echo "$GREETING $*"; ls /mnt/host
""")
    assert berth.ok("batch", batch, "a", "b") == "hello a b\n"
    assert (app / "batch-was-here").exists()
    conf = berth.write("only.conf", "#ENROOT_ENVIRON GREETING=conf\n")
    assert berth.ok("start", "-c", conf, "app", "sh", "-c", "echo $GREETING") == "conf\n"
    berth.write("bad.batch", "#ENROOT_ENVIRON GREETING=x\necho\n")
    berth.fails("batch", "bad.batch", needle="bad.batch: no #ENROOT_ROOTFS")
    berth.write("bad.batch", "#ENROOT_ROOTFS=app\n#ENROOT_NO_SUCH=1\n")
    berth.fails("batch", "bad.batch", needle="bad.batch:2: unknown setting 'ENROOT_NO_SUCH'")
    berth.fails("batch", "missing.batch", needle="missing.batch: cannot read")


# hooks ------------------------------------------------------------------------------

def test_hooks_add_mounts_and_environment(berth, app):
    host = berth.base / "host"
    (host / "f").write_text("hooked\n")
    berth.chown(host)
    berth.write("sys/hooks.d/20-site.sh", f"""#!/bin/sh
echo "{host} /hooked none bind,x-create=dir" >> "$ENROOT_MOUNTS"
# the container's variables are data in $ENROOT_ENVIRON, not the hook's own
foo=$(sed -n 's/^FOO=//p' "$ENROOT_ENVIRON" | tail -n 1)
echo "HOOKED=$foo-${{FOO:-unset}}-$ENROOT_PID" >> "$ENROOT_ENVIRON"
echo "hook chatter"
[ -d "$ENROOT_ROOTFS/etc" ] && [ -d "$BERTH_RUNTIME_DIR" ]
""", mode=0o755)
    berth.write("cfg/hooks.d/10-disabled.sh", "#!/bin/sh\nexit 1\n", mode=0o644)
    result = berth("start", "app", "sh", "-c", "cat /hooked/f; echo $HOOKED")
    assert result.stdout.startswith("hooked\nimage-unset-") and result.stdout.strip()[-1].isdigit()
    assert result.stderr == "hook chatter\n"  # never on stdout


def test_enroot_conf_hook_variables_reach_the_hooks_not_the_container(berth, app):
    """enroot exports an enroot.conf's NVIDIA_* and MELLANOX_* keys into the
    environment its hooks run in (its NVIDIA and Mellanox hooks prefer them
    to the container's), never into the container's environment; the
    caller's environment wins over the file."""
    berth.write("sys/enroot.conf", "NVIDIA_DRIVER_CAPABILITIES compute,utility\n"
                                   "MELLANOX_VISIBLE_DEVICES all\n")
    berth.write("sys/hooks.d/20-site.sh", '#!/bin/sh\n'
                'echo "hook: $NVIDIA_DRIVER_CAPABILITIES $MELLANOX_VISIBLE_DEVICES" >&2\n',
                mode=0o755)
    shown = 'echo "${NVIDIA_DRIVER_CAPABILITIES-unset} ${MELLANOX_VISIBLE_DEVICES-unset}"'
    result = berth("start", "app", "sh", "-c", shown)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "unset unset\n", "hook: compute,utility all\n")
    result = berth("start", "app", "sh", "-c", shown, env={"NVIDIA_DRIVER_CAPABILITIES": "video"})
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "unset unset\n", "hook: video all\n")


def test_failing_hook_aborts_and_is_named(berth, app):
    hook = berth.write("cfg/hooks.d/30-broken.sh", "#!/bin/sh\nexit 3\n", mode=0o755)
    berth.fails("start", "app", "true", needle=f"hook {hook} failed with exit status 3")
    # its last line is the reason, in berth's one line; what it said before stays before it
    berth.write("cfg/hooks.d/30-broken.sh", "#!/bin/sh\necho chatter\necho 'site hook: why' >&2\n"
                "echo >&2\nexit 1\n", mode=0o755)
    result = berth("start", "app", "true")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "chatter\nberth: error: hook 30-broken.sh: site hook: why\n"
    berth.write("cfg/hooks.d/30-broken.sh", "#!/bin/sh\necho 'only why' >&2\nexit 1\n", mode=0o755)
    berth.fails("start", "app", "true", needle="berth: error: hook 30-broken.sh: only why")
    berth.write("cfg/hooks.d/30-broken.sh",
                "#!/bin/sh\necho '/tmp ../../rel none bind' >> $ENROOT_MOUNTS\n", mode=0o755)
    berth.fails("start", "app", "true",
                needle="mount destination ../../rel escapes the container root")


def test_fuse_overlayfs_stands_in_when_the_kernel_refuses(tmp_path, usable_fuse):
    from test_syscalls import enter_user_and_mount_namespace, in_child

    from berth import syscalls
    from berth.container import rootfs
    (tmp_path / "lower").mkdir()
    (tmp_path / "lower/old").write_text("lower\n")
    (tmp_path / "merged").mkdir()

    def body():
        enter_user_and_mount_namespace()
        kernel_mount = syscalls.mount

        def refuse_overlay(source, target, fstype=None, flags=0, data=None):
            if fstype == "overlay":
                raise OSError(errno.EINVAL, "mount: Invalid argument")
            return kernel_mount(source, target, fstype, flags, data)
        syscalls.mount = refuse_overlay
        server = rootfs.mount_overlay(str(tmp_path / "lower"), str(tmp_path / "merged"),
                                      str(tmp_path / "scratch"))
        try:
            (tmp_path / "merged/new").write_text("upper\n")
            fstype = next(line.split()[2] for line in open("/proc/self/mounts")
                          if line.split()[1] == str(tmp_path / "merged"))
            return f"{fstype} {(tmp_path / 'merged/old').read_text().strip()}"
        finally:
            os.kill(server, signal.SIGTERM)
    assert in_child(body) == "fuse.fuse-overlayfs lower"
    assert sorted(os.listdir(tmp_path / "lower")) == ["old"]  # writes went to the upper dir


def test_list_fancy_shows_a_running_container_as_enroot_does(berth, app, images):
    berth.ok("create", "-n", "idle", images / "plain.sqsh")
    process, pid = start_detached(berth, "app")
    try:
        rows = [line.split() for line in berth.ok("list", "--fancy").splitlines()]
        assert rows[0] == ["NAME", "PID", "COMM", "STATE", "STARTED", "TIME", "MNTNS",
                           "USERNS", "COMMAND"]
        name, shown_pid, comm, state, started, used, mntns, userns, *command = rows[1]
        assert (name, shown_pid, comm) == ("app", str(pid), "sh")
        assert state in ("S", "R") and ":" in started and used == "00:00:00"
        assert mntns == os.readlink(f"/proc/{pid}/ns/mnt")[5:-1]
        assert userns == os.readlink(f"/proc/{pid}/ns/user")[6:-1]
        assert command[0] == "/bin/sh"
        assert rows[2] == ["idle"]
        assert berth.ok("list").splitlines() == ["app", "idle"]  # what the plugin reads
    finally:
        process.stdin.close()
        assert process.wait(timeout=10) == 0
