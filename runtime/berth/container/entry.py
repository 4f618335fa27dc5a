"""The last steps into a container: pivot_root and the namespaces after it.

These run after pivot_root, when the host's Python library is out of reach:
they use only what is imported already.
"""

import fcntl
import os
import select
import signal
import time

from berth import syscalls as sc
from berth.container import mounts
from berth.errors import BerthError


def enter(root, workdir):
    """pivot_root into `root`, detach the old root, chdir to `workdir`."""
    os.chdir(root)
    sc.pivot_root(".", ".")
    sc.umount2(".", sc.MNT_DETACH)
    try:
        os.chdir(workdir or "/")
    except OSError:
        raise BerthError(f"workdir {workdir} does not exist in the container") from None


def isolate(flags):
    """After pivot_root: the net, ipc, uts and pid namespaces `flags` asks for.

    They are made by the container's one user namespace (the one the root
    was built in), so joining it first lets `berth exec` or the SPANK
    plugin join all of them. A new net namespace has its loopback up (as
    enroot's has: 127.0.0.1 answers, nothing else is reachable) and its own
    sysfs, or, where the kernel refuses one (inside Docker, a /sys with
    masked paths), the host's /sys bound read-only; a new ipc namespace its own /dev/shm
    and /dev/mqueue. With CLONE_NEWPID this forks: the parent gets the
    child's pid and should only wait for it; the child (pid 1) gets 0.
    """
    if not flags:
        return 0
    sc.unshare(flags)
    if flags & sc.CLONE_NEWNET:
        sc.interface_up("lo")
        _own_sysfs()
    if flags & sc.CLONE_NEWIPC:
        _own_ipc_mounts()
    if flags & sc.CLONE_NEWPID:
        child = os.fork()
        if child:
            return child
        sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
    return 0


_RO_SYSFS = sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC


def _own_sysfs():
    try:
        sc.mount("sysfs", "/sys", "sysfs", _RO_SYSFS)
    except OSError:  # the host's /sys is already bound there: make it read-only
        mounts.remount_readonly("/sys")


def _own_ipc_mounts():
    sc.mount("tmpfs", "/dev/shm", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "mode=1777")
    if not os.path.isdir("/dev/mqueue"):
        try:
            os.mkdir("/dev/mqueue")
        except OSError:  # a /dev without it, not ours to change: no mqueue then
            return
    sc.mount("mqueue", "/dev/mqueue", "mqueue", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def mount_own_proc():
    """In a new pid namespace, /proc of that namespace."""
    sc.mount("proc", "/proc", "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def forward_signals(pid, signals):
    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # already gone: nothing to stop
            pass
    for sig in signals:
        signal.signal(sig, forward)


def relay(child):
    """Forward stop signals to `child`, wait for it, exit with its status."""
    forward_signals(child, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                            signal.SIGUSR1, signal.SIGUSR2))
    os._exit(exit_code(os.waitpid(child, 0)[1]))


def execvpe(command, env):
    """os.execvpe(command[0], command, env), the same search of env's PATH
    (os.defpath when unset), without os.get_exec_path: from Python 3.12 on
    that imports `warnings`, which is no longer loaded at start-up, and
    after pivot_root there is no library to import it from."""
    name = command[0]
    if "/" in name:
        os.execve(name, command, env)
    first = last = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory, name), command, env)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:  # as os.execvpe: report a found but failed one first
            last = e
            first = first or e
    raise first or last


def restore_signals():
    """The default actions of the signals Python ignores, for a program it execs."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


def spawn(program, argv, env):
    """Fork a child that execs `program` with stdin /dev/null and its output
    on stderr (stdout may be the --detach pid line); its pid. One that
    cannot exec exits 127."""
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(2, 1)
            restore_signals()
            os.execve(program, argv, env)
        finally:
            os._exit(127)
    return pid


# What read_environment runs after `script`: a shell exec'd with what it
# exported, that says so on fd 8 and then blocks on fd 9 (dash reaches fds
# 0-9 only) while its /proc/PID/environ is read.
_REPORT = "exec /bin/sh -c 'echo >&8; read -r _ <&9'"


def read_environment(script, env, seconds):
    """The environment /bin/sh has after running `script` from `env`, as
    ("environ", {KEY: VALUE}), or ("exit", its exit status), or ("timeout",
    None) after `seconds`.

    The shell runs as pid 1 of a pid namespace of its own: when the reading
    ends, the kernel kills everything it started, however it detached
    (setsid, double forks, a fork loop). It leads a session of its own too,
    so that what the scripts signal (kill 0, kill $PPID, which is 0 there,
    kill -1) is in that namespace, never berth. It gets stdin /dev/null and its
    output through a pipe relayed to stderr, so nothing it leaves holds the
    caller's descriptors. Needs CAP_SYS_ADMIN in the user namespace."""
    result_r, result_w = os.pipe()
    reader = os.fork()
    if reader == 0:
        try:
            os.close(result_r)
            sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
            try:
                outcome = _read_in_own_namespace(script, env, seconds)
            except OSError as e:
                outcome = [b"error", e.strerror.encode()]
            _report(result_w, outcome)
        finally:
            os._exit(0)
    os.close(result_w)
    with os.fdopen(result_r, "rb") as f:
        kind, _, value = f.read().partition(b" ")
    os.waitpid(reader, 0)
    if kind == b"environ":
        pairs = (os.fsdecode(e).partition("=") for e in value.split(b"\0") if e)
        return "environ", {key: value for key, _, value in pairs if key}
    if kind == b"exit":
        return "exit", int(value)
    if kind == b"timeout":
        return "timeout", None
    raise BerthError(f"cannot read the environment the image's scripts make: "
                     f"{value.decode(errors='replace') or 'the reader died'}")


def _report(fd, words):
    with os.fdopen(fd, "wb") as f:
        f.write(b" ".join(words))


def _read_in_own_namespace(script, env, seconds):
    """read_environment's reader: forks the shell as pid 1 of a new pid
    namespace, relays its output, reads its environment or its end; the
    shell's end (killed at the latest when this one dies) ends the rest."""
    sc.unshare(sc.CLONE_NEWPID)
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()  # the reporting shell's block; never written to
    output_r, output_w = os.pipe()
    shell = os.fork()
    if shell == 0:
        try:
            sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setsid()  # out of berth's process group: kill 0 reaches only the reading
            ready = fcntl.fcntl(ready_w, fcntl.F_DUPFD, 10)  # out of the way of the dup2s
            hold = fcntl.fcntl(hold_r, fcntl.F_DUPFD, 10)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(output_w, 1)
            os.dup2(output_w, 2)
            os.dup2(ready, 8)
            os.dup2(hold, 9)
            os.closerange(3, 8)
            os.closerange(10, os.sysconf("SC_OPEN_MAX"))
            restore_signals()
            os.execve("/bin/sh", ["/bin/sh", "-c", f"{script}\n{_REPORT}"], env)
        finally:
            os._exit(127)
    for fd in (ready_w, hold_r, output_w):
        os.close(fd)
    ended = os.pidfd_open(shell)
    deadline = time.monotonic() + seconds
    watched, outcome = [ready_r, output_r, ended], None
    while outcome is None:
        left = deadline - time.monotonic()
        ready = select.select(watched, [], [], max(left, 0))[0]
        if output_r in ready and not _relay(output_r):
            watched.remove(output_r)
        if ready_r in ready:
            if os.read(ready_r, 1):
                with open(f"/proc/{shell}/environ", "rb") as f:
                    outcome = [b"environ", f.read()]
                break
            watched.remove(ready_r)  # closed by the scripts: only its end can tell now
        if ended in ready:
            outcome = [b"exit", str(exit_code(os.waitpid(shell, 0)[1])).encode()]
            shell = None
        elif left <= 0:
            outcome = [b"timeout"]
    if shell:
        os.kill(shell, signal.SIGKILL)
        os.waitpid(shell, 0)  # returns once its namespace is empty
    while _relay(output_r):  # what is left of the output: every writer is gone
        pass
    return outcome


def _relay(fd):
    """Copy what `fd` has to stderr; False at its end."""
    chunk = os.read(fd, 65536)
    try:
        os.write(2, chunk)
    except OSError:  # a closed stderr: the output is lost, the reading goes on
        pass
    return bool(chunk)


def exit_code(wait_status):
    """A shell-style exit code: 128 + N for a child killed by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def new_user_namespace(uid, gid):
    """Unshare a user namespace where (uid, gid) inside are our own ids outside:
    the one mapping of a container, `UID UID 1`, or `0 UID 1` for a remapped
    root, as enroot's. This process keeps every capability in it until it
    execs (as a uid other than 0, without ambient capabilities)."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    sc.unshare(sc.CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {outer_uid} 1"),
                       ("gid_map", f"{gid} {outer_gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)  # (after pivot_root: no codecs)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
