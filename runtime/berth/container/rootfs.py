"""A container root inside the new mount namespace: build it, read it, enter it."""

import os
import signal
import time

from berth import rootpath, syscalls as sc
from berth.container import environ, mounts
from berth.image import imageconfig
from berth.errors import BerthError

_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


def remove_tree(path):
    """rm -rf `path`, giving its owner write access to directories on the way."""
    if not os.path.lexists(path):
        return
    for top, dirs, files in os.walk(path, topdown=False):
        os.chmod(top, 0o700)
        for name in files:
            os.unlink(os.path.join(top, name))
        # os.walk lists links to directories with the directories.
        for name in dirs:
            entry = os.path.join(top, name)
            (os.unlink if os.path.islink(entry) else os.rmdir)(entry)
    os.rmdir(path)


def image_config(root):
    """The image's env/entrypoint/cmd/workdir; images without a config give empty ones."""
    config = {"env": {}, "entrypoint": None, "cmd": None, "workdir": ""}
    if os.path.isfile(rootpath.resolve(root, imageconfig.IMAGE_JSON, follow_last=True)):
        image = imageconfig.read_image_config(root)
        config.update(entrypoint=image["entrypoint"], cmd=image["cmd"], workdir=image["workdir"],
                      env=environ.from_list(image["env"]))
    else:
        env_file = rootpath.resolve(root, "etc/environment", follow_last=True)
        if os.path.isfile(env_file):
            environ.read_file(env_file, config["env"], expand=False)
    return config


def mount_fuse(target, fstype, flags, server):
    """Mount a FUSE filesystem at `target` and start `server` for it; return its pid.

    The /dev/fuse connection is opened and mounted here, in the new user
    namespace (the kernel requires both there), and handed to the server as
    /dev/fd/N (libfuse 3). The server is started through a short-lived
    middle process so that it is no child of the container command; the
    subreaper berth adopts and reaps it, and it dies with berth.
    """
    try:
        fuse = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        raise BerthError(f"/dev/fuse: {e.strerror}: starting an image without unpacking it "
                         "needs /dev/fuse usable by this user (mode 0666)") from None
    sc.mount(fstype, target, f"fuse.{fstype}", flags,
             f"fd={fuse},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}")
    report_r, report_w = os.pipe()
    failed_r, failed_w = os.pipe()  # close-on-exec: end of file once the server runs
    starter = os.getppid()  # berth, the subreaper that adopts the server
    middle = os.fork()
    if middle == 0:
        try:
            _close_all_but((fuse, report_w, failed_w))  # the server holds nothing else of ours
            os.set_inheritable(fuse, True)
            me = os.getpid()
            server_pid = os.fork()
            if server_pid == 0:
                _exec_server(server, fuse, failed_w, me, starter)
            os.write(report_w, str(server_pid).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    os.close(failed_w)
    os.close(fuse)
    os.waitpid(middle, 0)
    with os.fdopen(report_r, "rb") as f:
        pid = f.read()
    with os.fdopen(failed_r, "rb") as f:
        failed = f.read()
    if not pid or failed:
        raise BerthError(f"{server[0]}: cannot be started (is it installed?)")
    return int(pid)


def _close_all_but(keep):
    last = -1
    for fd in sorted(keep):
        os.closerange(max(last + 1, 3), fd)
        last = fd
    os.closerange(max(last + 1, 3), os.sysconf("SC_OPEN_MAX"))


def _exec_server(server, fuse, failed_w, middle, starter):
    """In the server's process: once berth has adopted it, die with berth
    (PR_SET_PDEATHSIG: a SIGKILLed start leaves no FUSE server behind),
    then exec the server; a failure is written to failed_w."""
    try:
        while os.getppid() == middle:  # the middle process exits at once
            time.sleep(0.001)
        sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != starter and not sc.pid_alive(starter):  # berth died before that
            os._exit(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(server[0], [*server, f"/dev/fd/{fuse}"])
    except OSError:
        os.write(failed_w, b"x")
    finally:
        os._exit(127)


def mount_squashfs(image, target):
    """Serve `image` read-only at `target` with squashfuse; return its pid.

    In a user namespace that maps one uid (a container's), every file is
    shown as that uid and gid, as an unpacked image's files are the
    caller's: the image's owners (root, mostly) do not exist there."""
    with open("/proc/self/uid_map", "rb") as f:
        single = f.read().split()[2:3] == [b"1"]
    owner = ["-o", f"uid={os.getuid()},gid={os.getgid()}"] if single else []
    return mount_fuse(target, "squashfuse", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV,
                      ["squashfuse", "-f", image, *owner])


def mount_overlay(lower, target, scratch):
    """A writable overlay over `lower`, upper and work dirs on a private tmpfs.

    Kernel overlayfs first; where the kernel refuses (old kernels in a user
    namespace, some lower filesystems) fuse-overlayfs stands in and its pid
    is returned (None for the kernel's).
    """
    os.makedirs(scratch, exist_ok=True)
    sc.mount("tmpfs", scratch, "tmpfs", 0, "mode=0700")
    os.mkdir(f"{scratch}/upper")
    os.mkdir(f"{scratch}/work")
    options = f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work"
    try:
        sc.mount("overlay", target, "overlay", 0, options)
        return None
    except OSError as e:
        refused = e.strerror
    try:
        return mount_fuse(target, "fuse-overlayfs", sc.MS_NOSUID | sc.MS_NODEV,
                          ["fuse-overlayfs", "-f", "-o", options])
    except (OSError, BerthError) as e:
        raise BerthError(f"writable overlay on {target}: the kernel refused ({refused}) "
                         f"and fuse-overlayfs failed: {e}") from None


def system_mounts(restrict_dev, private_dev=False):
    """/proc, /dev, /sys and /tmp of every container, as Mounts, and the
    links to make in /dev after them (dev_links).

    /dev is the host's, bound; with restrict_dev a tmpfs holding a few
    device nodes; with private_dev (a new ipc namespace) a tmpfs holding
    the host's entries, each bound: what the container makes in /dev, its
    own /dev/mqueue among them, stays its own. A new pid or net namespace
    later gets its own proc or sysfs on top (see isolate): the host's would
    show the host's processes or devices."""
    if restrict_dev:
        dev = [_mount("tmpfs", "/dev", "tmpfs", "nosuid,noexec,mode=0755,x-create=dir")]
        dev += [_mount(f"/dev/{n}", f"/dev/{n}", "none", "bind,x-create=file") for n in _DEV_NODES]
        dev += [_mount("/dev/pts", "/dev/pts", "none", "rbind,x-create=dir"),
                _mount("tmpfs", "/dev/shm", "tmpfs", "nosuid,nodev,mode=1777,x-create=dir")]
    elif private_dev:
        dev = [_mount("tmpfs", "/dev", "tmpfs", "nosuid,mode=0755,x-create=dir")]
        for entry in _host_dev():
            if entry.name in ("shm", "mqueue") or entry.is_symlink():
                continue  # made anew: by isolate, or by dev_links
            kind = "rbind,x-create=dir" if entry.is_dir() else "bind,x-create=file"
            dev.append(_mount(entry.path, entry.path, "none", f"{kind},nofail"))
        dev.append(_mount("tmpfs", "/dev/shm", "tmpfs", "nosuid,nodev,mode=1777,x-create=dir"))
    else:
        dev = [_mount("/dev", "/dev", "none", "rbind,x-create=dir")]
    return [_mount("/proc", "/proc", "none", "rbind,x-create=dir"), *dev,
            _mount("/sys", "/sys", "none", "rbind,x-create=dir"),
            # rbind: a plain bind of a /tmp with anything mounted below it (any
            # user's FUSE mount) is refused in a user namespace (EINVAL)
            _mount("/tmp", "/tmp", "none", "rbind,x-create=dir")]


def _mount(source, target, fstype, options):
    return mounts.Mount(source, target, fstype, tuple(options.split(",")), "built-in mounts")


def _host_dev():
    return sorted(os.scandir("/dev"), key=lambda entry: entry.name)


def dev_links(restrict_dev, private_dev=False):
    """(name, target) of the symbolic links a tmpfs /dev needs: the usual
    ones, or with private_dev the host's own."""
    if restrict_dev:
        return [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                ("ptmx", "pts/ptmx")]
    if private_dev:
        return [(entry.name, os.readlink(entry.path)) for entry in _host_dev()
                if entry.is_symlink()]
    return []


def make_dev_links(root, links):
    dev = rootpath.resolve(root, "dev", follow_last=True)
    for name, target in links:
        os.symlink(target, f"{dev}/{name}")


def write_file(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
