"""A container root inside the new mount namespace: build it, read it, enter it."""

import os

from berth import rootpath, syscalls as sc
from berth.container import environ, mounts
from berth.errors import BerthError
from berth.image import imageconfig

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


# Where Apptainer and Singularity images keep their environment scripts and runscript
APPTAINER_ENV = "/.singularity.d/env"
APPTAINER_RUNSCRIPT = "/.singularity.d/runscript"


def image_config(root):
    """The image's env/entrypoint/cmd/workdir; images without a config give
    empty ones. An Apptainer image (no config, a /.singularity.d/env
    directory) is `apptainer`: its environment scripts run at each start,
    and its runscript is its entrypoint."""
    config = {"env": {}, "entrypoint": None, "cmd": None, "workdir": "", "apptainer": False}
    if os.path.isfile(rootpath.resolve(root, imageconfig.IMAGE_JSON, follow_last=True)):
        image = imageconfig.read_image_config(root)
        config.update(entrypoint=image["entrypoint"], cmd=image["cmd"], workdir=image["workdir"],
                      env=environ.from_list(image["env"]))
        return config
    env_file = rootpath.resolve(root, "etc/environment", follow_last=True)
    if os.path.isfile(env_file):
        environ.read_file(env_file, config["env"], expand=False)
    if os.path.isdir(rootpath.resolve(root, APPTAINER_ENV, follow_last=True)):
        config["apptainer"] = True
        if os.path.isfile(rootpath.resolve(root, APPTAINER_RUNSCRIPT, follow_last=True)):
            config["entrypoint"] = [APPTAINER_RUNSCRIPT]
    return config


def mount_overlay(lower, target, scratch, native=True, user_xattrs=False):
    """A writable overlay over `lower` (lowerdir's list), upper and work dirs
    on a private tmpfs; user_xattrs: the lower dirs mark opaque directories
    with user.overlay.opaque (image/parts.py), as the kernel's overlay
    reads them with `userxattr` and fuse-overlayfs always.

    Kernel overlayfs first (unless not `native`: ENROOT_NATIVE_OVERLAYFS=no);
    where the kernel refuses (old kernels in a user namespace, some lower
    filesystems) fuse-overlayfs stands in and its pid is returned (None for
    the kernel's).
    """
    os.makedirs(scratch, exist_ok=True)
    sc.mount("tmpfs", scratch, "tmpfs", 0, "mode=0700")
    os.mkdir(f"{scratch}/upper")
    os.mkdir(f"{scratch}/work")
    options = f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work"
    if native:
        try:
            sc.mount("overlay", target, "overlay", 0,
                     f"{options},userxattr" if user_xattrs else options)
            return None
        except OSError as e:
            refused = e.strerror
    else:
        refused = "ENROOT_NATIVE_OVERLAYFS=no"
    try:
        return mounts.mount_fuse(target, "fuse-overlayfs", sc.MS_NOSUID | sc.MS_NODEV,
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
