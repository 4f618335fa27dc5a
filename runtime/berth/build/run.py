"""RUN: a command in the stage's root, in Berth's own container: the one
uid mapped to root (as --container-remap-root), the fake-chown filter of
seccomp.py (so apt-get and dpkg can chown), the host's network with its
/etc/resolv.conf and /etc/hosts, a private /tmp, and no hooks (a build is
no job: no GPUs, home or Slurm); RUN --network=none gives it a network
namespace of its own with only lo, and RUN --mount its mounts
(runmounts.py). Its output goes to stderr; with quiet, to a file that is
shown only when the command fails."""

import contextlib
import os
import signal
import stat
import sys
import tempfile
import typing

from berth import safedir, syscalls as sc
from berth.build import tree
from berth.container import launch, mounts
from berth.errors import BerthError

_HOST_FILES = ("/etc/resolv.conf", "/etc/hosts")


# apt cannot switch to its sandbox user `_apt` where one uid is mapped: as
# the apt hook (hooks/10-aptfix.sh) does for a start, a Debian or Ubuntu
# root's RUN gets APT_CONFIG naming a file, in the private /tmp (so not in
# the image), that tells apt to stay root.
_APT_CONF = "/tmp/.berth-apt.conf"


def _apt_fix(root, runtime):
    """The mount and variable of the apt fix, for a root that has apt."""
    apt = os.path.join(root, "etc/apt/apt.conf.d")
    if not os.path.isdir(apt) or os.path.islink(os.path.join(root, "etc")) \
            or os.path.islink(os.path.join(root, "etc/apt")):
        return [], {}
    conf = os.path.join(runtime, "apt.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write('APT::Sandbox::User "root";\n')
    return [mounts.Mount(source=conf, target=_APT_CONF, fstype="none",
                         options=("bind", "ro", "x-create=file"), origin="berth build")], \
        {"APT_CONFIG": _APT_CONF}


def _mounts():
    found = [mounts.Mount(source="tmpfs", target="/tmp", fstype="tmpfs",
                          options=("nosuid", "nodev", "mode=1777", "x-create=dir"),
                          origin="berth build")]
    for path in _HOST_FILES:
        if os.path.isfile(path):
            found.append(mounts.Mount(source=path, target=path, fstype="none",
                                      options=("bind", "ro", "x-create=file"),
                                      origin="berth build"))
    return found


def _missing_mount_points(root):
    """The host files' mount points `root` lacks: a RUN makes them empty."""
    return [path for path in _HOST_FILES if not os.path.lexists(tree.path_in(root, path))]


def _remove_stubs(root, stubs):
    """The empty files a RUN's mounts left where the image had none, gone:
    BuildKit's image keeps no trace of them either."""
    for path in stubs:
        found = tree.path_in(root, path)
        with contextlib.suppress(OSError):
            info = os.lstat(found)
            if stat.S_ISREG(info.st_mode) and info.st_size == 0:
                os.unlink(found)


def _plan(cfg, root, *, command, env, extra):
    base = safedir.ensure(cfg["ENROOT_RUNTIME_PATH"], "ENROOT_RUNTIME_PATH")
    runtime = tempfile.mkdtemp(prefix="berth-build.", dir=base)
    apt_mounts, apt_env = _apt_fix(root, runtime)
    return launch.Plan(
        cfg=cfg, runtime=runtime, image=None, rootfs=root, scratch=None, writable=True,
        ids=(0, 0), unshare=sc.CLONE_NEWNET if extra.network == "none" else 0,
        pid_namespace=False, restrict_dev=False,
        mounts=_mounts() + apt_mounts + list(extra.mounts), env_files=[],
        env={**env, **apt_env}, hooks=[],
        rc=None, login=False, command=list(command), detach=False, porcelain=False,
        entrypoint=False, entrypoint_timeout=60)


class Extra(typing.NamedTuple):
    """What RUN's flags add to its container."""

    network: str = "default"  # "none": a network namespace of its own, only lo
    mounts: tuple = ()        # container.mounts.Mount values (runmounts.py)


NO_EXTRA = Extra()


def run(cfg, *, root, command, env, quiet, extra=NO_EXTRA):
    """Run `command` (argv) in `root` with `env`: its exit status. Its
    output goes to stderr, or with `quiet` to a file shown if it fails."""
    log = tempfile.TemporaryFile() if quiet else None
    saved = os.dup(1)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGQUIT)}
    sys.stdout.flush()
    try:
        os.dup2(log.fileno() if log else 2, 1)
        if log:
            saved_err = os.dup(2)
            os.dup2(log.fileno(), 2)
        stubs = _missing_mount_points(root)
        try:
            status = launch.start(_plan(cfg, root, command=command, env=env, extra=extra))
        finally:
            _remove_stubs(root, stubs)
            if log:
                os.dup2(saved_err, 2)
                os.close(saved_err)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        for sig, handler in handlers.items():  # (the start ignores them meanwhile)
            signal.signal(sig, handler)
    if status and log:
        log.seek(0)
        sys.stderr.buffer.write(log.read())
        sys.stderr.flush()
    if status in (128 + signal.SIGINT, -signal.SIGINT):
        raise KeyboardInterrupt
    return status


def check_user(user, where):
    """RUN runs as root: the one uid a user namespace of one uid maps."""
    if user not in ("", "root", "0", "root:root", "0:0"):
        raise BerthError(f"{where}: RUN after USER {user}: berth build runs commands as "
                         "root only (one uid is mapped; put USER after the last RUN)")
