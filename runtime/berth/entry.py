"""The last steps into a container: pivot_root, the nested namespaces, and
the `start --detach` keeper.

The keeper is a fresh interpreter (exec'd so that /proc/PID/environ is the
container's environment), so this module imports nothing but os, signal and
the syscalls: every import here delays the moment the container is ready.
"""

import os
import signal

from berth import syscalls as sc
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


def isolate(ids, flags):
    """After pivot_root: the namespaces the container's processes live in.

    The root was built as root of an outer user namespace (so that files
    the image owns as root can get mount points); here a nested user
    namespace maps the container's (uid, gid) `ids` onto that root, or none
    is made when `ids` is None (ENROOT_ALLOW_SUPERUSER). The mount, net,
    ipc, uts and pid namespaces are made here too, owned by the inner user
    namespace, so joining it first lets `berth exec` or the SPANK plugin
    join all of them. With CLONE_NEWPID this forks: the parent gets the
    child's pid and should only wait for it; the child (pid 1) gets 0.
    """
    if ids is not None:
        new_user_namespace(*ids)
    sc.unshare(sc.CLONE_NEWNS | flags)
    if flags & sc.CLONE_NEWNET:
        sc.mount("sysfs", "/sys", "sysfs", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
    if flags & sc.CLONE_NEWPID:
        child = os.fork()
        if child:
            return child
        sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
    return 0


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


def exit_code(wait_status):
    """A shell-style exit code: 128 + N for a child killed by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def new_user_namespace(uid, gid):
    """Unshare a user namespace where (uid, gid) inside are our own ids outside."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    sc.unshare(sc.CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {outer_uid} 1"),
                       ("gid_map", f"{gid} {outer_gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)  # (after pivot_root: no codecs)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


# What an entrypoint gets to exec: a shell of the image that reports ready on
# fd 3 (dash redirects fds 0-9 only) and stops itself until berth kills it.
_ENTRYPOINT_KEEPER = ("/bin/sh", "-c", 'echo ready >&3 && exec 3>&- && kill -STOP $$')


def keeper_main(root, workdir, status_fd, ids, flags, *entrypoint):
    """The --detach keeper: enter the root, report ready, wait for a signal.

    Runs as root of the outer user namespace (exec'd from the setup process
    with the final environment, which /proc/PID/environ then shows). Given
    the image's entrypoint, runs that instead, with the keeper shell as its
    arguments."""
    status = int(status_fd)
    try:
        enter(root, workdir)
        child = isolate(None if ids == "-" else tuple(map(int, ids.split(":"))), int(flags))
        if child:
            os.close(status)
            relay(child)
        host_pid = os.readlink("/proc/self")  # the host's /proc is still mounted
        if int(flags) & sc.CLONE_NEWPID:
            mount_own_proc()
        sc.drop_all_capabilities()
    except (OSError, BerthError) as e:
        os.write(status, f"error {e}\n".encode())
        os._exit(1)
    if entrypoint:
        _exec_entrypoint(list(entrypoint), host_pid, status)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: os._exit(0))
    os.write(status, f"ready {host_pid}\n".encode())
    os.close(status)
    while True:
        signal.pause()


def _exec_entrypoint(entrypoint, host_pid, status):
    os.write(status, f"entrypoint {host_pid}\n".encode())
    os.dup2(status, 3)
    if status != 3:
        os.close(status)
    os.dup2(2, 1)  # its output: with berth's messages, not into the void
    try:
        os.execvp(entrypoint[0], [*entrypoint, *_ENTRYPOINT_KEEPER])
    except OSError as e:
        os.write(3, f"error entrypoint {entrypoint[0]}: {e.strerror}\n".encode())
        os._exit(1)
