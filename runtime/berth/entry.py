"""The last steps into a container: pivot_root and the nested namespaces.

These run after pivot_root, when the host's Python library is out of reach:
they use only what is imported already.
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
