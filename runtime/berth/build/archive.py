"""ADD of a local tar archive (plain, gzip, bzip2 or xz): unpacked into the
destination directory, as BuildKit unpacks it. A file is an archive when
its first tar header reads (BuildKit's test): a gzip file of anything else
is copied as it is.

The archive is hostile. Every member stays under the destination, as
BuildKit keeps it there: a name is cleaned with the destination as `/` (a
`..` above it stays at it, a leading `/` goes), and a symbolic link on a
member's way is read with the destination as `/` (rootpath.resolve), so
none leads out of it; a symbolic link is made as it is (the container reads
it), a hard link only to a file under the destination. A device or FIFO
member is refused in one line naming the instruction's line and the
member: an unprivileged build cannot make one."""

import lzma
import os
import posixpath
import tarfile
import zlib

from berth import rootpath
from berth.build import context, tree
from berth.errors import BerthError

_BROKEN = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


def is_archive(opened):
    """Whether the file object `opened` (seekable) holds a tar archive."""
    try:
        with tarfile.open(fileobj=opened, mode="r:*") as tar:
            return tar.next() is not None
    except _BROKEN:
        return False
    finally:
        opened.seek(0)


def _clear(path):
    """Make room at `path` for a member (a directory stays for a directory)."""
    if os.path.islink(path) or os.path.lexists(path) and not os.path.isdir(path):
        os.unlink(path)
    elif os.path.isdir(path):
        tree.remove(path)


def _member(tar, member, top, *, refuse):
    """Make `member` under `top`: what it made (context.Placed: its own
    path and its new parents)."""
    name = posixpath.normpath("/" + member.name)
    if name == "/":
        return []
    path = rootpath.resolve(top, name)
    made = [context.Placed(path, owner=(member.uid, member.gid)),
            *(context.Placed(p) for p in context.make_parents(path))]
    mode = member.mode & 0o7777
    if member.isdir():
        if not os.path.isdir(path) or os.path.islink(path):
            _clear(path)
            os.mkdir(path, 0o700)
        os.chmod(path, mode | 0o700)  # (kept writable here: the image's is all root's)
    elif member.issym():
        _clear(path)
        os.symlink(member.linkname, path)
    elif member.islnk():
        target = rootpath.resolve(top, posixpath.normpath("/" + member.linkname))
        if not os.path.isfile(target) or os.path.islink(target):
            refuse(member, f"a hard link to {member.linkname}, no file under the destination")
        _clear(path)
        os.link(target, path)
    elif member.isreg():
        _clear(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, tar.extractfile(member) as data:
            while chunk := data.read(1 << 20):
                out.write(chunk)
            os.fchmod(out.fileno(), mode)
    else:
        refuse(member, "a device or FIFO (an unprivileged build cannot make one)")
    return made


def unpack(opened, *, root, dest, where, spec):
    """Unpack the archive `opened` into `dest` (a directory, in the container)
    of `root`; a refused member or a broken archive in one line. The host
    paths it made, as context.Placed (the destination's new directories
    included)."""
    def refuse(member, why):
        raise BerthError(f"{where}: ADD {spec}: member {member.name!r}: {why}")

    top = rootpath.resolve(root, dest, follow_last=True)
    if os.path.lexists(top) and not os.path.isdir(top):
        raise BerthError(f"{where}: ADD {spec}: {dest} is not a directory to unpack into")
    made = [] if os.path.isdir(top) else \
        [context.Placed(p) for p in (top, *context.make_parents(top))]
    os.makedirs(top, mode=0o755, exist_ok=True)
    try:
        with tarfile.open(fileobj=opened, mode="r:*") as tar:
            for member in tar:
                made += _member(tar, member, top, refuse=refuse)
    except _BROKEN as e:
        raise BerthError(f"{where}: ADD {spec}: a broken archive: {e}") from None
    return made
