"""A stage's tree put back from the step cache: its base unpacked once
(tree.unpack), then the layer of each cached step above it applied in
order (layers.py's tars, kept under the step's key). A step's cache
entry is its change only, so a step costs the size of its change, not a
squashfs of the whole root; the image's squashfs is made once, at the end.

A layer is read as the OCI layer spec says: `.wh.NAME` removes NAME,
`.wh..wh..opq` empties its directory of what the layers below gave it,
any other entry replaces what was at its path. Though the layers are this
user's own, every name is checked to stay in the tree and no entry is
written through a symbolic link: the tree's contents come from an image."""

import contextlib
import os
import shutil
import stat
import tarfile

from berth.build import layers
from berth.errors import BerthError


def _relative(name, blob):
    """`name` of a layer entry as a relative path with no `..`; else refused."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts:
        raise BerthError(f"{blob}: a layer entry leaves the tree: {name!r}")
    return "/".join(parts)


class _Tree:
    """The tree a layer is applied to, and the directories of it known real."""

    __slots__ = ("root", "blob", "real", "dirs")

    def __init__(self, root, blob):
        self.root, self.blob, self.real, self.dirs = root, blob, {""}, []

    def parent(self, path):
        """The host path of `path`'s directory, each of its parts checked to
        be a directory and not a symbolic link."""
        parent = os.path.dirname(path)
        if parent not in self.real:
            self.parent(parent)
            if not stat.S_ISDIR(os.lstat(os.path.join(self.root, parent)).st_mode):
                raise BerthError(f"{self.blob}: {parent} is not a directory in the tree")
            self.real.add(parent)
        return os.path.join(self.root, parent)

    def remove(self, path):
        where = os.path.join(self.root, path)
        try:
            os.unlink(where)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(where)
            self.real = {p for p in self.real if p != path and not p.startswith(path + "/")}


def _whiteout(tree, path):
    """A whiteout or opaque marker at `path`: its removals."""
    parent, name = os.path.split(path)
    tree.parent(path)
    if name == layers.OPAQUE:
        for entry in os.listdir(os.path.join(tree.root, parent)):
            tree.remove(os.path.join(parent, entry))
    else:
        tree.remove(os.path.join(parent, name[len(layers.WHITEOUT):]))


def _file(tar, member, where):
    source = tar.extractfile(member)
    fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        while chunk := source.read(layers.CHUNK):
            f.write(chunk)
        f.flush()  # (a write after the chmod would clear a setuid bit)
        os.fchmod(f.fileno(), member.mode)


def _entry(tar, member, tree, *, path):
    """`member` written at `path`, in place of what was there."""
    where = os.path.join(tree.parent(path), os.path.basename(path))
    if member.isdir():
        if not os.path.isdir(where) or os.path.islink(where):
            tree.remove(path)
            os.mkdir(where, 0o700)
        os.chmod(where, member.mode | 0o700)  # (kept writable to its owner, as unpack does)
        tree.dirs.append((where, member.mtime))
        return
    tree.remove(path)
    if member.isreg():
        _file(tar, member, where)
    elif member.issym():
        os.symlink(member.linkname, where)
    elif member.islnk():
        target = _relative(member.linkname, tree.blob)
        if not stat.S_ISREG(os.lstat(os.path.join(tree.parent(target),
                                                  os.path.basename(target))).st_mode):
            raise BerthError(f"{tree.blob}: a hard link to what is no file: {target}")
        os.link(os.path.join(tree.root, target), where, follow_symlinks=False)
    elif member.isfifo():
        os.mkfifo(where, member.mode)
    else:  # (a device: unprivileged, none is made, as unsquashfs makes none)
        with contextlib.suppress(PermissionError):
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
            os.mknod(where, kind | member.mode, os.makedev(member.devmajor, member.devminor))
        return
    with contextlib.suppress(FileNotFoundError):
        os.utime(where, (member.mtime, member.mtime), follow_symlinks=False)


def apply(root, blob):
    """The layer in the tar `blob` applied to the tree `root`."""
    tree = _Tree(root, blob)
    try:
        with tarfile.open(blob, "r|") as tar:
            for member in tar:
                path = _relative(member.name, blob)
                if os.path.basename(path).startswith(layers.WHITEOUT):
                    _whiteout(tree, path)
                else:
                    _entry(tar, member, tree, path=path)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise BerthError(f"{blob}: the cached step's layer: "
                         f"{getattr(e, 'strerror', None) or e}") from None
    for where, mtime in reversed(tree.dirs):  # (after what was made in them)
        with contextlib.suppress(FileNotFoundError):
            os.utime(where, (mtime, mtime), follow_symlinks=False)


def apply_steps(cfg, root, keys):
    """The layers of the cached steps `keys` applied to `root`, in order."""
    for key in keys:
        found = layers.kept(cfg, key)
        if found is None:
            raise BerthError("a cached step's layer is gone from the image cache (pruned "
                             "meanwhile?); build again, or with --no-cache")
        apply(root, layers.blob_path(cfg, found))
