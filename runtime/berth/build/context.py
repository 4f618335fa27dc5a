"""What COPY and ADD take: the files a source names, in the build context
(a directory of the user's, read as hostile: a source that leaves it, a
symbolic link on a source's way, a FIFO or a device is refused, never
followed or opened) or in an earlier stage's root; their checksum, of
names, kinds, modes and contents (never times), for the step's cache key;
and their copy into the stage's root, through its symlinks as the
container sees them (rootpath)."""

import fnmatch
import hashlib
import os
import stat
import typing

from berth import rootpath
from berth.errors import BerthError

_GLOB = "*?["


class Entry(typing.NamedTuple):
    path: str       # the host path
    name: str       # its name below the copied source ("" for the source itself)
    kind: str       # "file", "dir" or "link"
    mode: int       # permission bits
    target: str     # a link's target, else ""


class Placed(typing.NamedTuple):
    """A host path a copy made: an Entry's copy, an archive's member, or a
    directory made above one."""

    path: str
    entry: Entry = None  # what it is a copy of (None: a directory made on the way)
    owner: tuple = None  # the (uid, gid) its archive member names (ADD of an archive)


class Source(typing.NamedTuple):
    spec: str       # as the instruction names it
    is_dir: bool
    entries: list   # Entry values, the source's own first
    name: str = ""  # what a copy into a directory is named ("": its path's name)


def _refuse(where, spec, why):
    raise BerthError(f"{where}: COPY source '{spec}': {why}")


def _in_context(context, spec, where):
    """The host path of `spec` in the directory `context`, every component
    checked with lstat: no '..' above it, no symbolic link on the way."""
    if spec.startswith("/"):
        _refuse(where, spec, "an absolute path (sources are relative to the build context)")
    parts = [p for p in spec.split("/") if p not in ("", ".")]
    if ".." in parts:
        _refuse(where, spec, "'..' leaves the build context")
    path = context
    for part in parts:
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            _refuse(where, spec, "not found in the build context")
        if stat.S_ISLNK(mode):
            _refuse(where, spec, f"{os.path.relpath(path, context)} is a symbolic link "
                                 "(berth build never follows one out of the context)")
    return path


def _expand(context, spec, where, *, root, seen):
    """The paths a source names: its glob matched in the last component."""
    if root is not None:
        return [rootpath.resolve(root, spec, follow_last=True)]
    head, tail = os.path.split(spec)
    if not any(c in tail for c in _GLOB):
        return [_in_context(context, spec, where)]
    parent = _in_context(context, head, where) if head else context
    found = sorted(os.path.join(parent, n) for n in os.listdir(parent)
                   if fnmatch.fnmatch(n, tail) and seen(os.path.join(parent, n)) != "out")
    if not found:
        _refuse(where, spec, "matches no file in the build context")
    return [_in_context(context, os.path.relpath(p, context), where) for p in found]


def _entry(path, name, *, where, spec):
    st = os.lstat(path)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return Entry(path=path, name=name, kind="file", mode=mode, target="")
    if stat.S_ISDIR(st.st_mode):
        return Entry(path=path, name=name, kind="dir", mode=mode, target="")
    if stat.S_ISLNK(st.st_mode):
        return Entry(path=path, name=name, kind="link", mode=mode, target=os.readlink(path))
    return _refuse(where, spec, f"{name or os.path.basename(path)} is a FIFO, socket or "
                                "device: only files, directories and links are copied")


def _kept(ignore, context, path):
    """What the ignore file does to `path`: "kept", "out", or "walk" (left
    out, but an exception may keep something below it)."""
    if ignore is None or context is None:
        return "kept"
    name = os.path.relpath(path, context)
    if not ignore.excludes(name):
        return "kept"
    return "walk" if os.path.isdir(path) and not os.path.islink(path) \
        and ignore.may_keep_under(name) else "out"


def _below(directory, *, where, spec, seen):
    """The entries below the Entry `directory`, each directory before what it
    holds; one the ignore file leaves out is not there, nor is a directory it
    leaves out that keeps nothing."""
    entries = []
    for child in sorted(os.listdir(directory.path)):
        path = os.path.join(directory.path, child)
        kept = seen(path)
        if kept == "out":
            continue
        found = _entry(path, f"{directory.name}/{child}".lstrip("/"), where=where, spec=spec)
        inside = _below(found, where=where, spec=spec, seen=seen) if found.kind == "dir" else []
        if kept == "kept" or inside:
            entries += [found, *inside]
    return entries


def _walk(path, where, spec, *, seen):
    top = _entry(path, "", where=where, spec=spec)
    return [top, *(_below(top, where=where, spec=spec, seen=seen) if top.kind == "dir" else [])]


def gather(specs, *, context, where, root=None, ignore=None):
    """The Source of each of `specs`, from `context` (less what the Ignore
    `ignore` leaves out) or (COPY --from) the stage root `root`; a missing or
    refused one in one line."""
    def seen(path):
        return _kept(ignore, None if root else context, path)

    sources = []
    for spec in specs:
        for path in _expand(context, spec, where, root=root, seen=seen):
            if not os.path.lexists(path):
                _refuse(where, spec, "not found" + (" in the stage" if root else ""))
            if seen(path) == "out":
                _refuse(where, spec, f"left out of the build context by {ignore.file}")
            entries = _walk(path, where, spec, seen=seen)
            # (a stage's link is followed, and the copy named as the source names it)
            name = os.path.basename(spec.rstrip("/")) if root is not None else ""
            sources.append(Source(spec=spec, is_dir=entries[0].kind == "dir", entries=entries,
                                  name=name))
    return sources


def open_file(entry):
    """The file `entry` found, opened without following a link or blocking
    on a FIFO: what was swapped in after the walk is refused, not read."""
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise BerthError(f"{entry.path}: {e.strerror} (changed during the build?)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BerthError(f"{entry.path}: no longer a regular file (changed during the build?)")
    return os.fdopen(fd, "rb")


def checksum(sources):
    """The sha256 of what `sources` hold: names, kinds, modes, contents."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(f"source {source.spec}\0".encode())
        for entry in source.entries:
            digest.update(f"{entry.name}\0{entry.kind}\0{entry.mode:o}\0{entry.target}\0"
                          .encode(errors="surrogateescape"))
            if entry.kind == "file":
                with open_file(entry) as f:
                    digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def make_parents(path):
    """The directories above the host path `path`, made 0755 where missing:
    those it made (COPY --chown gives them its owner, as BuildKit does)."""
    made, parent = [], os.path.dirname(path)
    while not os.path.lexists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    return made


def _place(root, dest, entry, *, chmod):
    """Copy one entry to `dest` (a path in the container) of `root`: what
    it made (Placed: the entry's copy, then its new parents)."""
    target = rootpath.resolve(root, dest)
    made = [Placed(target, entry), *(Placed(path) for path in make_parents(target))]
    mode = chmod if chmod is not None else entry.mode
    if entry.kind == "dir":
        if not os.path.isdir(target) or os.path.islink(target):
            _remove(target)
            os.mkdir(target, 0o700)
        os.chmod(target, mode | 0o700)  # kept writable here: the image's is all root's
        return made
    _remove(target)
    if entry.kind == "link":
        os.symlink(entry.target, target)
        return made
    with open_file(entry) as src:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
            os.fchmod(out.fileno(), mode)
    return made


def _remove(target):
    if os.path.islink(target) or os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    elif os.path.isdir(target):
        import shutil  # (a directory replaced by a file: rare)
        shutil.rmtree(target)


def copy(sources, *, root, dest, chmod=None):
    """Copy `sources` to `dest` (absolute, in the container) of `root`:
    a directory's contents into it; a file to it, or into it when it ends
    with '/', names a directory there, or more than one source is copied.
    What it made or replaced (Placed), in order."""
    into = dest.endswith("/") or len(sources) > 1 or os.path.isdir(
        rootpath.resolve(root, dest, follow_last=True))
    made = []
    for source in sources:
        base = dest if source.is_dir or not into else \
            f"{dest.rstrip('/')}/{source.name or os.path.basename(source.entries[0].path)}"
        for entry in source.entries:
            made += _place(root, f"{base.rstrip('/')}/{entry.name}" if entry.name else base or "/",
                           entry, chmod=chmod)
    return made
