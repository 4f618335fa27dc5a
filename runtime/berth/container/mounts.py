"""Mounts into a container root: fstab lines and `-m` specs.

An fstab line is `SRC DST TYPE OPTIONS`; DST is a path inside the container
(a relative one is taken from its root: `home` is `/home`).
As in enroot, TYPE may be left out before OPTIONS (`/proc /proc rbind`), and
both where SRC names the type (`tmpfs /tmp`).
The options are enroot's fstab vocabulary (FLAGS below); with TYPE other
than a bind, what is not in it goes to the filesystem as mount data
(size=, mode=, ...); on a bind an unknown option is refused, naming it.

`-m` (and the SPANK plugin's --container-mounts, pyxis's forms):
  SRC:DST[:FLAGS]     recursive bind of SRC at DST (a relative SRC is taken
                      from the current directory)
  SRC                 the same, at the same path inside
  tmpfs:DST[:OPTS]    a fresh tmpfs, OPTS also tmpfs's (size=, mode=, huge=...)
  umount:DST          remove what is mounted at DST: applied last, after the
                      hooks' mounts too (the home hook's /root, say), as
                      under pyxis and enroot
  SRC:DST:sqsh        mount the squashfs image SRC (or a SIF file's partition) read-only at DST
FLAGS and OPTS are joined by '+' (or ',').

FLAGS: ro, rw, bind, rbind, the enroot/mount(8) flags (nosuid/suid,
nodev/dev, noexec/exec, noatime/atime, nodiratime/diratime,
relatime/norelatime, strictatime/nostrictatime, lazytime/nolazytime,
iversion/noiversion, mand/nomand, sync/async, dirsync, silent/loud,
nosymfollow, defaults), the propagation modes (private, rprivate, slave,
rslave, shared, rshared, unbindable, runbindable), nofail (skip the mount
when it fails), x-create=dir|file|auto (create a missing destination; auto
follows the source's type), x-detach (unmount DST instead: the fstab form
of umount:), x-move (move the mount at SRC, a path in the container, to
DST), remount (new flags for what is already mounted at DST, SRC unused:
as enroot's 10-cgroups.sh makes /sys/fs/cgroup read-only; its per-mount
flags only, a bind remount, whatever else the line says) and sqsh; the
last three are for fstab lines only.

A destination is resolved inside the root with symlinks read with the root
as `/`; one that still climbs above it (a `..` past `/`) is refused when it
is mounted, naming it, with enroot's words for it (EXDEV's).
`$VAR`/`${VAR}` in an fstab line expand from the container's environment.

The FUSE servers are started here (mount_fuse): the squashfs server
image/squashserve.py chooses for a sqsh mount and for a start's image
(mount_squashfs), fuse-overlayfs for rootfs.py's overlay where the kernel
refuses one.
"""

import collections
import errno
import os
import re
import signal
import time

from berth import syscalls as sc
from berth.config import text_lines
from berth.errors import BerthError
from berth.image import imagefile, squashserve
from berth.rootpath import resolve

_MS_SYNCHRONOUS, _MS_MANDLOCK, _MS_DIRSYNC, _MS_NOSYMFOLLOW = 0x10, 0x40, 0x80, 0x100
_MS_SILENT, _MS_UNBINDABLE, _MS_MOVE = 0x8000, 0x20000, 0x2000
_MS_I_VERSION, _MS_STRICTATIME, _MS_LAZYTIME = 0x800000, 0x1000000, 0x2000000

# flag -> (bits it sets, bits it clears)
_FLAGS = {
    "bind": (sc.MS_BIND, 0), "rbind": (sc.MS_BIND | sc.MS_REC, 0),
    "ro": (sc.MS_RDONLY, 0), "rw": (0, sc.MS_RDONLY), "defaults": (0, 0),
    "nosuid": (sc.MS_NOSUID, 0), "suid": (0, sc.MS_NOSUID),
    "nodev": (sc.MS_NODEV, 0), "dev": (0, sc.MS_NODEV),
    "noexec": (sc.MS_NOEXEC, 0), "exec": (0, sc.MS_NOEXEC),
    "noatime": (sc.MS_NOATIME, 0), "atime": (0, sc.MS_NOATIME),
    "nodiratime": (sc.MS_NODIRATIME, 0), "diratime": (0, sc.MS_NODIRATIME),
    "relatime": (sc.MS_RELATIME, 0), "norelatime": (0, sc.MS_RELATIME),
    "strictatime": (_MS_STRICTATIME, 0), "nostrictatime": (0, _MS_STRICTATIME),
    "lazytime": (_MS_LAZYTIME, 0), "nolazytime": (0, _MS_LAZYTIME),
    "iversion": (_MS_I_VERSION, 0), "noiversion": (0, _MS_I_VERSION),
    "mand": (_MS_MANDLOCK, 0), "nomand": (0, _MS_MANDLOCK),
    "sync": (_MS_SYNCHRONOUS, 0), "async": (0, _MS_SYNCHRONOUS),
    "dirsync": (_MS_DIRSYNC, 0), "nosymfollow": (_MS_NOSYMFOLLOW, 0),
    "silent": (_MS_SILENT, 0), "loud": (0, _MS_SILENT),
}
_PROPAGATION = {
    "private": sc.MS_PRIVATE, "rprivate": sc.MS_PRIVATE | sc.MS_REC,
    "slave": sc.MS_SLAVE, "rslave": sc.MS_SLAVE | sc.MS_REC,
    "shared": sc.MS_SHARED, "rshared": sc.MS_SHARED | sc.MS_REC,
    "unbindable": _MS_UNBINDABLE, "runbindable": _MS_UNBINDABLE | sc.MS_REC,
}
_CREATE = {"x-create=dir", "x-create=file", "x-create=auto"}
_OURS = _CREATE | {"nofail", "x-detach", "x-move", "remount", "sqsh"}
FLAGS = frozenset(_FLAGS) | frozenset(_PROPAGATION) | _OURS
# tmpfs's own options (mount data), as `tmpfs:DST:OPTS` accepts them
_TMPFS_KEYS = {"size", "nr_blocks", "nr_inodes", "mode", "uid", "gid", "huge", "mpol",
               "noswap", "inode32", "inode64", "quota", "usrquota", "grpquota"}
# statvfs bits a remount of a bind mount must keep (the kernel locks them).
_LOCKED = ((os.ST_NOSUID, sc.MS_NOSUID), (os.ST_NODEV, sc.MS_NODEV),
           (os.ST_NOEXEC, sc.MS_NOEXEC), (os.ST_NOATIME, sc.MS_NOATIME),
           (os.ST_NODIRATIME, sc.MS_NODIRATIME), (os.ST_RELATIME, sc.MS_RELATIME))
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class Mount(collections.namedtuple("Mount", "source target fstype options origin")):
    """One mount; options is a tuple, origin says where it came from (for messages)."""

    __slots__ = ()

    @property
    def is_bind(self):
        return "bind" in self.options or "rbind" in self.options

    @property
    def is_umount(self):
        return "x-detach" in self.options

    @property
    def is_move(self):
        return "x-move" in self.options

    @property
    def is_squashfs(self):
        return "sqsh" in self.options

    @property
    def is_remount(self):
        return "remount" in self.options


def _check_flags(options, origin, allowed_data=()):
    for option in options:
        if option in FLAGS or option.split("=", 1)[0] in allowed_data:
            continue
        raise BerthError(f"{origin}: unknown mount flag '{option}'")


def _are_options(field):
    """Whether an fstab field is an OPTIONS list rather than a TYPE."""
    return all(part in FLAGS for part in field.split(","))


def parse_fstab_line(line, origin, environ):
    """One fstab line as a Mount, or None for a blank or comment line."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    fields = _VAR.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), line).split()
    if len(fields) == 3 and _are_options(fields[2]):  # `SRC DST OPTIONS`, as enroot allows
        fields = [fields[0], fields[1], "none", fields[2]]
    if len(fields) == 2 and "/" not in fields[0]:  # `tmpfs /tmp`: the type is SRC
        fields.append(fields[0])
    if len(fields) < 3:
        raise BerthError(f"{origin}: expected 'SRC DST TYPE [OPTIONS]', got '{line}'")
    source, target, fstype = fields[:3]
    options = tuple(o for o in fields[3].split(",") if o) if len(fields) > 3 else ()
    mount = Mount(source, target, fstype, options, origin)
    if mount.is_bind or mount.is_squashfs or mount.is_move or mount.is_umount or mount.is_remount:
        _check_flags(options, origin)
    return mount


def read_fstab(path, environ):
    found = []
    for number, line in text_lines(path):
        mount = parse_fstab_line(line, f"{path}:{number}", environ)
        if mount:
            found.append(mount)
    return found


_SPEC_ORIGIN = "-m "


def parse_spec(spec, cwd=None):
    """One `-m` spec (see the module's doc) as a Mount; a relative SRC is
    taken from `cwd` (default: the current directory)."""
    origin = f"{_SPEC_ORIGIN}{spec}"
    parts = spec.split(":")
    if len(parts) == 1:
        parts = [spec, os.path.abspath(os.path.join(cwd or os.getcwd(), spec))]
    if len(parts) > 3 or not parts[0] or not parts[1]:
        raise BerthError(f"{origin}: expected SRC[:DST[:FLAGS]], tmpfs:DST[:OPTIONS] "
                         "or umount:DST")
    source, target = parts[0], parts[1]
    flags = tuple(f for f in re.split(r"[+,]", parts[2]) if f) if len(parts) == 3 else ()
    if source == "tmpfs":
        _check_flags(flags, origin, _TMPFS_KEYS)
        for flag in flags:
            if flag in ("bind", "rbind", "sqsh", "x-detach"):
                raise BerthError(f"{origin}: '{flag}' does not apply to a tmpfs")
        return Mount("tmpfs", target, "tmpfs", ("x-create=dir", *flags), origin)
    if source == "umount":
        _check_flags(flags, origin)
        extra = [f for f in flags if f != "nofail"]
        if extra:
            raise BerthError(f"{origin}: umount:DST takes no flag but nofail, got '{extra[0]}'")
        return Mount("none", target, "none", ("x-detach", *flags), origin)
    _check_flags(flags, origin)
    for flag in ("x-detach", "x-move", "remount"):
        if flag in flags:
            raise BerthError(f"{origin}: {flag} is for fstab lines (-m takes umount:DST)")
    source = os.path.abspath(os.path.join(cwd or os.getcwd(), source))
    if "sqsh" in flags:
        return Mount(source, target, "squashfs", ("x-create=dir", "ro", *flags), origin)
    recursion = () if "bind" in flags else ("rbind",)
    return Mount(source, target, "none", (*recursion, "x-create=auto", *flags), origin)


def after_hooks(mount):
    """Whether `mount` is applied after the hooks' mounts: a `-m umount:DST`."""
    return mount.is_umount and mount.origin.startswith(_SPEC_ORIGIN)


def locked_flags(path):
    mounted = os.statvfs(path).f_flag
    return sum(ms for st, ms in _LOCKED if mounted & st)


def remount_readonly(path):
    sc.mount(None, path, None, sc.MS_REMOUNT | sc.MS_BIND | sc.MS_RDONLY | locked_flags(path))


def _create(target, kind, source):
    if kind == "auto":
        kind = "file" if source and os.path.exists(source) and not os.path.isdir(source) else "dir"
    if kind == "dir":
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a", encoding="utf-8"):
            pass


def resolve_target(root, name):
    """Host path of the destination `name` in `root`: symlinks are read with
    `root` as `/`; a `..` that climbs above `/` is refused."""
    return resolve(root, name, follow_last=True, what="mount destination")


def _open_inside(root, path, name):
    """An O_PATH descriptor of `path`, checked to be `root` or below it now that
    it exists (so a directory swapped for a symlink meanwhile cannot lead out)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    real = os.readlink(f"/proc/self/fd/{fd}")
    top = os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip("/") + "/"):
        os.close(fd)
        raise BerthError(f"mount destination {name} escapes the container root: "
                         f"{os.strerror(errno.EXDEV)}")
    return fd


def _move(root, source, target_fd):
    """Move the mount at `source` (a path in the container) onto the target."""
    path = resolve_target(root, source)
    if not os.path.lexists(path):
        raise BerthError(f"x-move source {source} does not exist in the container")
    fd = _open_inside(root, path, source)
    try:
        sc.mount(f"/proc/self/fd/{fd}", f"/proc/self/fd/{target_fd}", None, _MS_MOVE)
    except OSError as e:
        raise BerthError(f"cannot move the mount at {source}: {os.strerror(e.errno)}"
                         if e.errno == 22 else f"x-move {source}: {os.strerror(e.errno)}") from None
    finally:
        os.close(fd)


class _Options(collections.namedtuple("_Options", "flags propagation data create")):
    """A Mount's options as mount(2) takes them: the flags, the propagation
    mode, the filesystem's data, and what x-create= asks (or None)."""

    __slots__ = ()


def _fold(options):
    flags, propagation, data, create = 0, 0, [], None
    for option in options:
        if option in _FLAGS:
            flags = (flags | _FLAGS[option][0]) & ~_FLAGS[option][1]
        elif option in _PROPAGATION:
            propagation |= _PROPAGATION[option]
        elif option.startswith("x-create="):
            create = option.split("=", 1)[1]
        elif option not in _OURS:
            data.append(option)
    return _Options(flags=flags, propagation=propagation, data=data, create=create)


def apply(root, mount):
    """Mount `mount` into the container root `root` (inside our mount
    namespace); return the pid of the FUSE server it started (sqsh), or None."""
    flags, propagation, data, create = _fold(mount.options)
    try:
        if (mount.is_bind or mount.is_squashfs) and not mount.is_remount \
                and not os.path.exists(mount.source):
            # (pyxis's words, which scripts grep for, then the path)
            raise BerthError(f"mount source path does not exist: {mount.source}")
        if mount.is_squashfs:  # a squashfs, or a SIF file's partition
            try:
                data_image = imagefile.locate(mount.source)
            except BerthError as e:
                raise BerthError(f"mount source {e}") from None
        target = resolve_target(root, mount.target)
        if mount.is_umount:
            fd = _open_inside(root, target, mount.target)
            try:
                sc.umount2(f"/proc/self/fd/{fd}", sc.MNT_DETACH)
            except OSError as e:
                raise BerthError(
                    f"nothing is mounted at {mount.target} to unmount" if e.errno == 22
                    else f"umount {mount.target}: {e.strerror}") from None
            finally:
                os.close(fd)
            return None
        if not os.path.lexists(target):
            if create not in ("dir", "file", "auto"):
                raise BerthError(f"mount destination {mount.target} does not exist in the "
                                 "container (x-create=dir|file creates it)")
            _create(target, create, mount.source if mount.is_bind else None)
        fd = _open_inside(root, target, mount.target)
        try:
            if mount.is_move:
                _move(root, mount.source, fd)
                return None
            if mount.is_squashfs:
                server = mount_squashfs(data_image, f"/proc/self/fd/{fd}")
                # Wait until it serves: until then it may still be loading its
                # libraries, from a root pivot_root would soon swap for the container's.
                os.listdir(target)
                return server
            if not mount.is_remount:  # (whose flags are the remount below)
                fstype = None if mount.is_bind else mount.fstype
                first = flags & ~sc.MS_RDONLY if mount.is_bind else flags
                sc.mount(mount.source, f"/proc/self/fd/{fd}", fstype, first,
                         ",".join(data) or None)
        finally:
            os.close(fd)
        per_mount = flags & ~(sc.MS_BIND | sc.MS_REC)
        if (mount.is_bind or mount.is_remount) and per_mount:  # a bind takes them from a remount
            sc.mount(None, target, None,
                     sc.MS_REMOUNT | sc.MS_BIND | per_mount | locked_flags(target))
        if propagation:
            sc.mount(None, target, None, propagation)
    except (OSError, BerthError) as e:
        if "nofail" not in mount.options:
            if isinstance(e, OSError):
                reason = f"{mount.target}: {os.strerror(e.errno) if e.errno else e.strerror}"
            else:
                reason = str(e)
            raise BerthError(f"{mount.origin}: {reason}") from None
    return None


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
        # stdout too: it may be a pipe a caller reads to its end (the SPANK
        # plugin reads a keeper's), which a server outliving berth would hold open
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        # A mount namespace of its own, a copy of this one before the
        # container's pivot_root, which would make the container's root the
        # server's root and cwd too: a path the server opens later (glibc
        # loading libgcc_s when squashfuse_ll 0.5's threads end, a helper
        # it runs) would then be looked up through the mount it serves, by
        # itself, and wait forever once it has stopped answering.
        sc.unshare(sc.CLONE_NEWNS)
        os.execvp(server[0], [*server, f"/dev/fd/{fuse}"])
    except OSError:
        os.write(failed_w, b"x")
    finally:
        os._exit(127)


def mount_squashfs(image, target):
    """Serve the imagefile.Squashfs `image` read-only at `target` with the
    server squashserve chooses (at its offset: a SIF file's partition);
    return its pid.

    In a user namespace that maps one uid (a container's), every file is
    shown as that uid and gid, as an unpacked image's files are the
    caller's: the image's owners (root, mostly) do not exist there."""
    with open("/proc/self/uid_map", "rb") as f:
        single = f.read().split()[2:3] == [b"1"]
    server = squashserve.argv(image, (os.getuid(), os.getgid()) if single else None)
    # (the type stays fuse.squashfuse whichever server: what scripts look for)
    return mount_fuse(target, "squashfuse", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV, server)
