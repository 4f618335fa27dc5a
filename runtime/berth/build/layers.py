"""Each changing step's change as an OCI layer (image-layer spec): a tar
of what the step made or changed, a `.wh.NAME` for what it removed, a
`.wh..wh..opq` in a directory it replaced. It is written when the step
runs, from the stage's tree itself: before the step, every entry's inode
and ctime (a Snapshot, a walk of stat calls); after it, what differs. A
change moves the ctime, which no one can set back, so the diff is exact
while the bytes read are those of the change only.

The tar is deterministic: entries sorted (each directory's whiteouts before
its other entries), every entry root's (0:0, no names, as the squashfs
has it) but where COPY --chown gave another (owners.py), each mtime the
file's own (as BuildKit keeps them). It goes to the image cache's
blobs/sha256 under its digest (the layer's diff_id) as it is, and a record
of it (Layer, JSON) under the step's key: a rebuild reads it back without
a gunzip, and a build that writes only a squashfs never compresses
anything, as BuildKit compresses only what it exports. Its gzip (no name
or time) is made the first time an OCI output or a push needs it, kept
beside it and named in the record."""

import gzip
import hashlib
import json
import os
import stat
import tarfile
import typing

from berth.errors import BerthError
from berth.image.cachelayout import CacheLayout

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_LEVEL = 6  # (gzip: the default level of Go's compress/gzip, which BuildKit writes with)
CHUNK = 1 << 20  # (the bytes a layer tar is read or written in at once)


class Layer(typing.NamedTuple):
    diff_id: str              # sha256:... of the tar, the blob kept
    size: int                 # the tar's bytes
    digest: str = None        # sha256:... of its gzip, once an output needed it
    packed_size: int = None   # the gzip's bytes


class Snapshot(typing.NamedTuple):
    """A tree's entries: relative path -> (inode, ctime ns, is a directory)."""

    entries: dict


def snapshot(root):
    """The Snapshot of `root`, each directory given its owner's rwx before
    the walk enters it (tree.owner_writable's rule, in the same walk): what
    a RUN made 0500 or 0000 must be read, packed and removed."""
    entries = {}
    pending = [""]
    while pending:
        top = pending.pop()
        prefix = f"{top}/" if top else ""
        with os.scandir(f"{root}/{top}") as found:
            for entry in found:
                info = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(info.st_mode)
                if is_dir and info.st_mode & 0o700 != 0o700:
                    os.chmod(entry.path, info.st_mode | 0o700)
                    info = os.lstat(entry.path)
                path = prefix + entry.name
                entries[path] = (info.st_ino, info.st_ctime_ns, is_dir)
                if is_dir:
                    pending.append(path)
    return Snapshot(entries)


def _order(path):
    """Parents first; in a directory, its whiteouts before its entries."""
    parent, name = os.path.split(path)
    return (tuple(parent.split("/")) if parent else (), not name.startswith(WHITEOUT), name)


def changes(before, after):
    """The entries of the layer that makes `after` of `before` (Snapshots):
    sorted paths, whiteouts and opaque markers among them."""
    old, new = before.entries, after.entries
    replaced = {path for path, (ino, _, is_dir) in new.items()
                if is_dir and old.get(path, (None, None, False))[2] and old[path][0] != ino}
    paths = [path for path, now in new.items() if old.get(path) != now]
    paths += [os.path.join(path, OPAQUE) for path in replaced]
    for path in old.keys() - new.keys():
        parent, name = os.path.split(path)
        if parent not in replaced and (not parent or new.get(parent, (0, 0, False))[2]):
            paths.append(os.path.join(parent, WHITEOUT + name))
    return sorted(paths, key=_order)


class _Hashing:
    """A file object that hashes what it writes through."""

    __slots__ = ("file", "sha", "size")

    def __init__(self, file):
        self.file, self.sha, self.size = file, hashlib.sha256(), 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self):
        self.file.flush()


def _info(root, path, links, *, owners):
    """The TarInfo of `path` in `root` (a whiteout: an empty file), its
    owner from `owners` (owners.py), else root."""
    info = tarfile.TarInfo(path)
    info.uid, info.gid = owners.get(path, (0, 0))
    info.uname = info.gname = ""
    name = os.path.basename(path)
    if name.startswith(WHITEOUT):
        info.mode = 0o644
        return info
    st = os.lstat(os.path.join(root, path))
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_ino in links:
        info.type, info.linkname = tarfile.LNKTYPE, links[st.st_ino]
    elif stat.S_ISREG(st.st_mode):
        links[st.st_ino] = path
        info.size = st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(os.path.join(root, path))
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
    else:
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return info


def _write_tar(blob, root, paths, *, owners):
    """The layer tar of `paths` in `root` (owners: _info's) into the file
    `blob`: its hashing object."""
    links = {}
    plain = _Hashing(blob)
    with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            info = _info(root, path, links, owners=owners)
            if info.isreg() and info.size:
                with open(os.path.join(root, path), "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return plain


def _blob_written(cfg, write):
    """`write(file)` into a new blob of the image cache, which it returns
    hashed (a _Hashing): the blob renamed to its digest; its hashing."""
    blobs = CacheLayout(cfg["ENROOT_CACHE_PATH"]).dir("layers")
    os.makedirs(blobs, mode=0o700, exist_ok=True)
    partial = os.path.join(blobs, f"build-layer.tmp-{os.getpid()}")
    try:
        with open(partial, "wb") as blob:
            hashed = write(blob)
        os.rename(partial, os.path.join(blobs, hashed.sha.hexdigest()))
    except OSError as e:
        raise BerthError(f"{e.filename or blobs}: the step's layer: {e.strerror}") from None
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)
    return hashed


def write(cfg, root, paths, owners=None):
    """The layer of `paths` (changes()'s) in `root`, into the image cache's
    blobs: its Layer. `owners` ({path: (uid, gid)}) gives an entry's owner
    other than root's (COPY --chown)."""
    plain = _blob_written(cfg, lambda blob: _write_tar(blob, root, paths, owners=owners or {}))
    return Layer(diff_id=f"sha256:{plain.sha.hexdigest()}", size=plain.size)


def _gzip(tar_path, blob):
    packed = _Hashing(blob)
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0,
                       compresslevel=_LEVEL) as zipped, open(tar_path, "rb") as tar:
        while chunk := tar.read(CHUNK):
            zipped.write(chunk)
    return packed


def compressed(cfg, key, layer):
    """`layer` (the step `key`'s) with its gzip blob in the cache: the one
    its record names where it is still there, else made of the tar now and
    recorded."""
    if layer.digest and os.path.isfile(packed_path(cfg, layer)):
        return layer
    packed = _blob_written(cfg, lambda blob: _gzip(blob_path(cfg, layer), blob))
    layer = layer._replace(digest=f"sha256:{packed.sha.hexdigest()}", packed_size=packed.size)
    keep(cfg, key, layer)
    return layer


def keep(cfg, key, layer):
    """Record `layer` as the change of the step `key` (a step cache key)."""
    where = CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_layer(key)
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    partial = f"{where}.tmp-{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(layer._asdict(), f, sort_keys=True)
    os.rename(partial, where)


def kept(cfg, key):
    """The Layer of the step `key`, or None when its record or blob is gone
    (a step run before layers were kept, a pruned blob)."""
    try:
        with open(CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_layer(key), encoding="utf-8") as f:
            layer = Layer(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None
    return layer if isinstance(layer.diff_id, str) and os.path.isfile(blob_path(cfg, layer)) \
        else None


def blob_path(cfg, layer):
    """The layer's tar in the image cache."""
    return _in_blobs(cfg, layer.diff_id)


def packed_path(cfg, layer):
    """The layer's gzip in the image cache (compressed()'s)."""
    return _in_blobs(cfg, layer.digest)


def _in_blobs(cfg, digest):
    return os.path.join(CacheLayout(cfg["ENROOT_CACHE_PATH"]).dir("layers"),
                        digest.removeprefix("sha256:"))
