"""RUN's flags as BuildKit reads them: `--network=default|host|none` and
`--mount=type=cache|bind|tmpfs,...` (comma-separated KEY=VALUE fields,
quoted as CSV), each read into a RunMount; a secret or ssh mount, a field
a type does not take, or a value it cannot be, refused in one line."""

import csv
import posixpath
import typing

from berth import units
from berth.errors import BerthError

NETWORKS = ("default", "host", "none")
SHARING = ("shared", "private", "locked")
_TARGET = ("target", "dst", "destination")
_SOURCE = ("source", "src")
_READ_ONLY = ("ro", "readonly")
_WRITABLE = ("rw", "readwrite")
_FIELDS = {  # type -> the fields it takes, besides type and target
    "bind": (*_SOURCE, "from", *_READ_ONLY, *_WRITABLE),
    "cache": ("id", "sharing", "mode", "uid", "gid", "from", *_SOURCE, *_READ_ONLY,
              *_WRITABLE),
    "tmpfs": ("size",),
}


class RunMount(typing.NamedTuple):
    kind: str            # "bind", "cache" or "tmpfs"
    target: str          # absolute, in the container
    source: str = "."    # bind: a path in the context, or in the stage `origin`; cache: in it
    origin: str = None   # from=: a stage's name or number, or an image's name (None: the
    #                      context for a bind, an empty directory for a new cache)
    writable: bool = False  # bind: writable, its changes discarded; a cache: unless ro
    cache_id: str = ""   # cache: its id (default: the target)
    sharing: str = "shared"
    mode: int = 0o755    # cache: the mode of its directory
    size: int = 0        # tmpfs: its bound in bytes (0: the kernel's default)


class RunFlags(typing.NamedTuple):
    network: str = "default"
    mounts: tuple = ()   # RunMount values


def _fields(text, where):
    try:
        (row,) = csv.reader([text])
    except (csv.Error, ValueError):
        raise BerthError(f"{where}: RUN --mount={text}: not comma-separated fields") from None
    fields = {}
    for field in row:
        name, equals, value = field.partition("=")
        fields[name.strip().lower()] = value if equals else None
    return fields


def _flag(fields, names, at):
    """A boolean field (ro, rw: alone or =true|false)."""
    found = [(n, fields[n]) for n in names if n in fields]
    if not found:
        return None
    name, value = found[-1]
    if value not in (None, "true", "false", "1", "0"):
        raise BerthError(f"{at}: {name}={value}: expected true or false")
    return value in (None, "true", "1")


def _octal(value, name, at):
    if value is None or not value or any(c not in "01234567" for c in value) \
            or int(value, 8) > 0o7777:
        raise BerthError(f"{at}: {name}={value}: expected an octal mode")
    return int(value, 8)


def _cache(fields, target, at):
    for name in ("uid", "gid"):  # (one uid is mapped: a build's files are root's)
        if fields.get(name, "0") not in ("0",):
            raise BerthError(f"{at}: {name}={fields[name]}: berth build "
                             "maps one uid, so a cache mount is root's (0) only")
    sharing = fields.get("sharing") or "shared"
    if sharing not in SHARING:
        raise BerthError(f"{at}: sharing={sharing}: expected "
                         "shared, private or locked")
    mode = _octal(fields["mode"], "mode", at) if "mode" in fields else 0o755
    return RunMount(kind="cache", target=target, cache_id=fields.get("id") or target,
                    sharing=sharing, mode=mode, origin=fields.get("from"),
                    source=next((fields[n] for n in _SOURCE if fields.get(n)), "."),
                    writable=not _flag(fields, _READ_ONLY, at))


def mount(text, where):
    """The RunMount of `--mount=TEXT`."""
    fields = _fields(text, where)
    at = f"{where}: RUN --mount={text}"  # (what each refusal begins with)
    kind = fields.get("type") or "bind"
    if kind in ("secret", "ssh"):
        raise BerthError(f"{where}: RUN --mount=type={kind}: not supported by berth build")
    if kind not in _FIELDS:
        raise BerthError(f"{where}: RUN --mount=type={kind}: expected bind, cache or tmpfs")
    unknown = sorted(set(fields) - {"type", *_TARGET, *_FIELDS[kind]})
    if unknown:
        raise BerthError(f"{at}: {unknown[0]}: not a field of a "
                         f"{kind} mount")
    target = next((fields[n] for n in _TARGET if fields.get(n)), None)
    if not target:
        raise BerthError(f"{at}: needs a target")
    target = posixpath.normpath(posixpath.join("/", target))
    if target == "/":
        raise BerthError(f"{at}: a mount over / is not allowed")
    if kind == "cache":
        return _cache(fields, target, at)
    if kind == "tmpfs":
        size = units.size(fields["size"]) if fields.get("size") else 0
        if size is None:
            raise BerthError(f"{at}: size={fields['size']}: expected "
                             "a size such as 64M")
        return RunMount(kind="tmpfs", target=target, size=size)
    source = next((fields[n] for n in _SOURCE if fields.get(n)), ".")
    read_only, writable = _flag(fields, _READ_ONLY, at), _flag(fields, _WRITABLE, at)
    return RunMount(kind="bind", target=target, source=source, origin=fields.get("from"),
                    writable=bool(writable) and not read_only)


def read(flags, where, *, expand=str):
    """The RunFlags of RUN's `flags` ("--mount=...", "--network=..."), each
    value through `expand` (the step's variables) first."""
    network, mounts = "default", []
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "--network":
            network = expand(value)
            if network not in NETWORKS:
                raise BerthError(f"{where}: RUN --network={network}: expected default, "
                                 "host or none")
        elif name == "--mount":
            mounts.append(mount(expand(value), where))
    targets = [m.target for m in mounts]
    if len(set(targets)) < len(targets):
        raise BerthError(f"{where}: RUN --mount: two mounts at one target")
    return RunFlags(network=network, mounts=tuple(mounts))


def stages_named(flags):
    """The from= values of RUN's bind and cache mounts (the stages or
    images it takes from)."""
    found = []
    for flag in flags:
        if flag.startswith("--mount="):
            try:
                fields = _fields(flag[8:], "")
            except BerthError:
                continue  # (read() says so, naming the line)
            if fields.get("from") and (fields.get("type") or "bind") in ("bind", "cache"):
                found.append(fields["from"])
    return found
