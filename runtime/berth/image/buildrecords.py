"""The small records a build keeps beside its layers (cachelayout.py:
build-layers/, build-sums/, build-urls/), forgotten by `berth cache
prune` once what they name is gone: a step's layer record once its tar
is, its owners record once its layer record is, a COPY --from's checksum
once a layer or the cached base image of its root is (or by
--older-than, from its last use), an ADD URL's record once the blob of
its file is. Read through cachescan's descriptors: a record is opened
without following a link or waiting on a FIFO, read up to a bound, and
what it names is looked up only where it is a well-formed name (a
digest, an image's file name), never as a path. A record that is none of
these (another file, unreadable, not JSON) is removed: the build writes
it again.
"""

import json
import os
import re
import stat
import typing

from berth.errors import BerthError
from berth.image.cachelayout import IMAGE_NAME, LAYER_NAME
from berth.image.cachescan import disk_usage, files, holds_file, last_use

_RECORD_MAX = 1 << 20  # (a checksum's record lists a root's layers: a few KiB)
_DIGEST_RECORD = re.compile(r"[0-9a-f]{64}\.json")
_OWNERS_RECORD = re.compile(r"([0-9a-f]{64})\.owners\.json")
_PARTIAL = re.compile(r".+\.tmp-\d+")  # a build's record being written: left to it


class Forgotten(typing.NamedTuple):
    """How many records of each kind a prune removed."""

    layer_records: int
    sum_records: int
    url_records: int


class Held(typing.NamedTuple):
    """What `berth cache` lists of a build's: how many, and their bytes."""

    count: int
    size: int


def steps_held(cache):
    """The build steps whose layers the CacheDirs `cache` holds, and the
    bytes of those layers, their tars and the gzips made of them (counted
    among the cache's layers too)."""
    dir_fd, digests, count = cache.fds["build-layers"], set(), 0
    for item in files(dir_fd):
        record = read_record(item.name, dir_fd) if _DIGEST_RECORD.fullmatch(item.name) else None
        if isinstance(record, dict) and _has_layer(cache, record.get("diff_id")):
            count += 1
            digests.update(record[field].removeprefix("sha256:") for field in ("diff_id", "digest")
                           if _has_layer(cache, record.get(field)))
    return Held(count=count, size=sum(_file_size(cache.fds["layers"], d) for d in digests))


def mounts_held(cache):
    """The RUN --mount=type=cache directories of the CacheDirs `cache` and
    the bytes their files take on disk, walked without following a link."""
    dir_fd = cache.fds["build-cache"]
    if dir_fd is None:
        return Held(count=0, size=0)
    _, dirs, _, _ = next(os.fwalk(dir_fd=dir_fd), (None, [], None, None))
    return Held(count=len(dirs), size=disk_usage(dir_fd))


def _file_size(dir_fd, name):
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    except OSError:
        return 0


def forget_gone(cache, cutoff):
    """Remove the build records of the CacheDirs `cache` whose layers or
    image are gone, and the checksums last used before `cutoff` (None: any
    age); after the layers and images were pruned."""
    def step_gone(dir_fd, name):
        owners = _OWNERS_RECORD.fullmatch(name)
        if owners:
            return not holds_file(dir_fd, f"{owners[1]}.json")
        return _blob_gone(cache, dir_fd, name, field="diff_id")

    def sum_gone(dir_fd, name):
        record = read_record(name, dir_fd) if LAYER_NAME.fullmatch(name) else None
        return not isinstance(record, dict) or not _root_kept(cache, record) \
            or (cutoff is not None and _used(dir_fd, name) < cutoff)

    return Forgotten(layer_records=_forget(cache, "build-layers", step_gone),
                     sum_records=_forget(cache, "build-sums", sum_gone),
                     url_records=_forget(cache, "build-urls",
                                         lambda dir_fd, name: _blob_gone(cache, dir_fd, name)))


def _forget(cache, kind, gone):
    """Remove each record in `kind`'s directory that `gone(dir_fd, name)`
    says is of nothing kept; how many went."""
    dir_fd, removed = cache.fds[kind], 0
    for item in files(dir_fd):
        if not _PARTIAL.fullmatch(item.name) and gone(dir_fd, item.name) \
                and _unlink(cache, kind, item.name):
            removed += 1
    return removed


def _blob_gone(cache, dir_fd, name, field="digest"):
    """Whether the record `name` (<hex>.json, naming a blob by its digest
    in `field`) is no such record, or its blob is gone."""
    record = read_record(name, dir_fd) if _DIGEST_RECORD.fullmatch(name) else None
    return not isinstance(record, dict) or not _has_layer(cache, record.get(field))


def _root_kept(cache, record):
    """Whether every layer and the cached image a checksum's record names
    are still in the cache."""
    digests, image = record.get("layers"), record.get("image")
    if not isinstance(digests, list) or not all(_has_layer(cache, d) for d in digests):
        return False
    if image is None:
        return True
    return isinstance(image, str) and IMAGE_NAME.fullmatch(image) is not None \
        and holds_file(cache.fds["images"], image)


def _has_layer(cache, digest):
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        return False
    name = digest.removeprefix("sha256:")
    return LAYER_NAME.fullmatch(name) is not None and holds_file(cache.fds["layers"], name)


def read_record(name, dir_fd=None):
    """The JSON of the regular file `name` (in the directory open as
    `dir_fd`), or None: a link is not followed, a FIFO not waited on, a file
    read up to a bound and JSON nested past Python's depth is no record."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    with open(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return json.loads(f.read(_RECORD_MAX + 1))
        except (OSError, ValueError, RecursionError):  # (a record past the bound is no JSON)
            return None


def _used(dir_fd, name):
    try:
        return last_use(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except OSError:
        return 0


def _unlink(cache, kind, name):
    try:
        os.unlink(name, dir_fd=cache.fds[kind])
    except FileNotFoundError:
        return False
    except OSError as e:
        raise BerthError(f"{cache.dir_path(kind)}/{name}: {e.strerror}") from None
    return True
