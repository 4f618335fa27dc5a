"""Mounts into a container root: fstab lines, `-m SRC:DST[:FLAGS]` specs.

An fstab line is `SRC DST TYPE OPTIONS`; DST is a path inside the container.
Options understood here (the rest go to the filesystem as mount data):
bind, rbind, ro, rw, nosuid, nodev, noexec, noatime, nodiratime, relatime,
defaults, the propagation modes (private, rprivate, slave, rslave, shared,
rshared), nofail (skip the mount when it fails) and x-create=dir|file|auto
(create a missing destination; auto follows the source's type).
`$VAR`/`${VAR}` in a line expand from the container's environment.
"""

import collections
import os
import re

from berth import rootpath, syscalls as sc
from berth.errors import BerthError

_FLAGS = {
    "bind": sc.MS_BIND, "rbind": sc.MS_BIND | sc.MS_REC, "ro": sc.MS_RDONLY, "rw": 0,
    "nosuid": sc.MS_NOSUID, "nodev": sc.MS_NODEV, "noexec": sc.MS_NOEXEC,
    "noatime": sc.MS_NOATIME, "nodiratime": sc.MS_NODIRATIME, "relatime": sc.MS_RELATIME,
    "defaults": 0,
}
_PROPAGATION = {
    "private": sc.MS_PRIVATE, "rprivate": sc.MS_PRIVATE | sc.MS_REC,
    "slave": sc.MS_SLAVE, "rslave": sc.MS_SLAVE | sc.MS_REC,
    "shared": sc.MS_SHARED, "rshared": sc.MS_SHARED | sc.MS_REC,
}
_CREATE = {"x-create=dir", "x-create=file", "x-create=auto"}
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


def _check_target(target, origin):
    if not target.startswith("/"):
        raise BerthError(f"{origin}: mount destination '{target}' is not an absolute path")


def parse_fstab_line(line, origin, environ):
    """One fstab line as a Mount, or None for a blank or comment line."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    fields = _VAR.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), line).split()
    if len(fields) < 3:
        raise BerthError(f"{origin}: expected 'SRC DST TYPE [OPTIONS]', got '{line}'")
    source, target, fstype = fields[:3]
    options = tuple(fields[3].split(",")) if len(fields) > 3 else ()
    _check_target(target, origin)
    return Mount(source, target, fstype, options, origin)


def read_fstab(path, environ):
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    found = []
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BerthError(f"{path}:{number}: not UTF-8 text") from None
        mount = parse_fstab_line(line, f"{path}:{number}", environ)
        if mount:
            found.append(mount)
    return found


def parse_spec(spec):
    """`-m SRC:DST[:FLAGS]` (FLAGS joined by '+' or ',') as a recursive bind Mount."""
    origin = f"-m {spec}"
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise BerthError(f"{origin}: expected SRC:DST[:FLAGS]")
    source, target = os.path.abspath(parts[0]), parts[1]
    _check_target(target, origin)
    flags = tuple(f for f in re.split(r"[+,]", parts[2]) if f) if len(parts) == 3 else ()
    for flag in flags:
        if flag not in _FLAGS and flag not in _PROPAGATION and flag not in _CREATE | {"nofail"}:
            raise BerthError(f"{origin}: unknown mount flag '{flag}'")
    return Mount(source, target, "none", ("rbind", "x-create=auto") + flags, origin)


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


def apply(root, mount):
    """Mount `mount` into the container root `root` (inside our mount namespace)."""
    flags = 0
    propagation = 0
    data = []
    create = None
    for option in mount.options:
        if option in _FLAGS:
            flags |= _FLAGS[option]
        elif option in _PROPAGATION:
            propagation |= _PROPAGATION[option]
        elif option.startswith("x-create="):
            create = option.split("=", 1)[1]
        elif option != "nofail":
            data.append(option)
    try:
        if mount.is_bind and not os.path.exists(mount.source):
            raise BerthError(f"mount source {mount.source} does not exist")
        target = rootpath.resolve(root, mount.target, follow_last=True)
        if not os.path.exists(target):
            if create not in ("dir", "file", "auto"):
                raise BerthError(f"mount destination {mount.target} does not exist in the "
                                 "container (x-create=dir|file creates it)")
            _create(target, create, mount.source if mount.is_bind else None)
        fstype = None if mount.is_bind else mount.fstype
        first = flags & ~sc.MS_RDONLY if mount.is_bind else flags
        sc.mount(mount.source, target, fstype, first, ",".join(data) or None)
        if mount.is_bind and flags & sc.MS_RDONLY:
            remount_readonly(target)
        if propagation:
            sc.mount(None, target, None, propagation)
    except (OSError, BerthError) as e:
        if "nofail" not in mount.options:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise BerthError(f"{mount.origin}: {reason}") from None
