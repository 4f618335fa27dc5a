"""berth.syscalls, each call exercised for real in a forked child's namespaces."""

import errno
import os
import signal
import socket
import traceback

import pytest

from berth import syscalls as sc


def in_child(function):
    """Run `function` in a forked child; return what it returned (a str) or raise."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            message = "ok " + function()
        except BaseException:  # reported to the parent, whatever it is
            message = "failed " + traceback.format_exc()
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        message = f.read()
    os.waitpid(pid, 0)
    status, _, value = message.partition(" ")
    assert status == "ok", value
    return value


def enter_user_and_mount_namespace(inside_uid=None):
    uid, gid = os.getuid(), os.getgid()
    sc.unshare(sc.CLONE_NEWUSER | sc.CLONE_NEWNS)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid if inside_uid is None else inside_uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)


def test_mount_and_umount_stay_in_the_namespace(tmp_path):
    def body():
        enter_user_and_mount_namespace()
        sc.mount("tmpfs", str(tmp_path), "tmpfs", sc.MS_NOSUID, "size=1m")
        (tmp_path / "inside").write_text("x")
        assert os.statvfs(tmp_path).f_flag & os.ST_NOSUID
        sc.umount2(str(tmp_path), sc.MNT_DETACH)
        return str(os.path.exists(tmp_path / "inside"))
    assert in_child(body) == "False"
    assert list(tmp_path.iterdir()) == []


def test_errors_name_the_target(tmp_path):
    def body():
        enter_user_and_mount_namespace()
        with pytest.raises(OSError) as failure:
            sc.mount("tmpfs", str(tmp_path / "missing"), "tmpfs")
        assert failure.value.errno == errno.ENOENT
        return str(failure.value)
    assert f"mount {tmp_path}/missing" in in_child(body)


def test_pivot_root_into_a_tmpfs(tmp_path):
    def body():
        enter_user_and_mount_namespace()
        sc.mount("tmpfs", str(tmp_path), "tmpfs")
        (tmp_path / "only-here").mkdir()
        os.chdir(tmp_path)
        sc.pivot_root(".", ".")
        sc.umount2(".", sc.MNT_DETACH)
        os.chdir("/")
        return " ".join(os.listdir("/"))
    assert in_child(body) == "only-here"


def test_setns_joins_another_process_namespaces():
    ready_r, ready_w = os.pipe()
    holder = os.fork()
    if holder == 0:  # owns a user + uts namespace with its own hostname
        enter_user_and_mount_namespace(inside_uid=0)
        sc.unshare(sc.CLONE_NEWUTS)
        socket.sethostname("bctr-joined")
        os.write(ready_w, b"x")
        signal.pause()  # until the test kills it
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"

        def body():
            # Open every namespace first: once in the holder's user namespace,
            # /proc/<holder>/ns may no longer be ours to open.
            fds = [(os.open(f"/proc/{holder}/ns/{name}", os.O_RDONLY), flag)
                   for name, flag in (("user", sc.CLONE_NEWUSER), ("uts", sc.CLONE_NEWUTS))]
            for fd, flag in fds:
                sc.setns(fd, flag)
            return socket.gethostname()
        assert in_child(body) == "bctr-joined"
        assert socket.gethostname() != "bctr-joined"
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_seccomp_filter_fakes_ownership_and_id_calls(tmp_path):
    """In a user namespace where only our uid exists, chown and setuid to
    another id fail (EINVAL); under the filter they return 0 and change
    nothing, setfsuid(-1) still answers, and the process shows Seccomp: 2."""
    from berth.container import seccomp
    probe = tmp_path / "probe"
    probe.write_text("")
    os.chmod(tmp_path, 0o777)

    def body():
        enter_user_and_mount_namespace()
        with pytest.raises(OSError) as refused:
            os.chown(probe, 4242, 4242)
        assert refused.value.errno == errno.EINVAL
        assert seccomp.install()
        os.chown(probe, 4242, 4242)
        os.lchown(probe, 4242, 4242)
        os.chown(probe, 4242, 4242, follow_symlinks=False)  # fchownat
        with open(probe) as f:
            os.fchown(f.fileno(), 4242, 4242)
        os.setgroups([4242])
        os.setgid(4242)
        os.setuid(4242)
        os.setresuid(4242, 4242, 4242)
        os.setreuid(4242, 4242)
        libc = __import__("ctypes").CDLL(None)
        faked = libc.setfsuid(4242)
        current = libc.setfsuid(-1)  # a query: the kernel's answer, the real fsuid
        status = dict(line.split(":\t", 1) for line in open("/proc/self/status"))
        st = os.stat(probe)
        return (f"{st.st_uid} {os.getuid()} {os.getgid()} {faked} {current} "
                f"{status['Seccomp'].strip()} {status['NoNewPrivs'].strip()}")
    uid, gid = os.getuid(), os.getgid()
    assert in_child(body) == f"{uid} {uid} {gid} 0 {uid} 2 1"


def test_seccomp_program_is_known_for_two_architectures_only():
    from berth.container import seccomp
    for machine in ("x86_64", "aarch64"):
        code = seccomp.program(machine)
        assert code[-1] == (0x06, 0, 0, 0x7FFF0000) and len(code) < 40
        assert all(jt + i < len(code) and jf + i < len(code) for i, (_, jt, jf, _) in
                   enumerate(code))
    assert seccomp.program("ppc64le") is None


def test_seccomp_program_prints_as_c_initializers():
    """What the SPANK plugin's C array must equal (a contract test there can run this)."""
    import subprocess
    import sys

    from berth.container import seccomp
    out = subprocess.run([sys.executable, "-m", "berth.container.seccomp", "aarch64"],
                         capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(sc.__file__)))
    rows = [tuple(int(v, 0) for v in line.strip("{}, ").split(", "))
            for line in out.stdout.splitlines()]
    assert rows == seccomp.program("aarch64")
