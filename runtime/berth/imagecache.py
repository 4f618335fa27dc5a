"""Imported squashfs images kept for reuse, and `berth cache` (PAINPOINTS #5, #7).

$ENROOT_CACHE_PATH/images/<key>.sqsh is the image an import made, under a
key over everything that decides its content: the platform manifest, the
digest and URI its image config records, the squash options and FORMAT.
An import of the same key copies it instead of unpacking the layers again;
a moved tag has a new manifest digest, so a new key. An entry appears only
whole (built beside it, then renamed) and is checked before use, so a
damaged one is built again, never copied out.

Layers and images keep their last use as their mtime; `berth cache prune`
removes the least recently used first and skips what an import holds the
lock of or used meanwhile. Locks only save duplicate work: every entry is
written under a temporary name and renamed, so no writer corrupts another.
"""

import collections
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import time

from berth import squash
from berth.blobs import BlobCache, locked, make_dirs, open_lock, touch
from berth.errors import BerthError

# Bump when the same inputs would make another image: the image config
# layout (imageconfig.py), the fixed mksquashfs flags (squash.py).
FORMAT = 1
_LAYER_NAME = re.compile(r"[0-9a-f]{64}")
_IMAGE_NAME = re.compile(r"[0-9a-f]{64}\.sqsh")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)(?:I?B)?", re.IGNORECASE)
_KINDS = ("layers", "images", "partial")


class ImageCache:
    def __init__(self, cache_path):
        self.image_dir = os.path.join(cache_path, "images")
        self.lock_dir = os.path.join(cache_path, "locks")
        # uris/<hash of URI and options> -> ../images/<key>.sqsh: the entry
        # last imported for that URI, for `import --reuse`; dropped by prune.
        self.uri_dir = os.path.join(cache_path, "uris")

    @staticmethod
    def key(manifest_digest, digest, uri, squash_options):
        fields = [FORMAT, manifest_digest, digest, uri, squash_options]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

    def path(self, key):
        return os.path.join(self.image_dir, f"{key}.sqsh")

    def lock_path(self, key):
        return os.path.join(self.lock_dir, f"image-{key}")

    def locked(self, key, ref, quiet):
        """One import of an image at a time: the second copies what the first built."""
        make_dirs(self.image_dir, self.lock_dir)
        return locked(self.lock_path(key), f"waiting for another import of {ref}", quiet)

    def _uri_link(self, uri, squash_options):
        name = hashlib.sha256(json.dumps([FORMAT, uri, squash_options]).encode()).hexdigest()
        return os.path.join(self.uri_dir, name)

    def remember(self, uri, squash_options, key):
        """Record `key` as the latest image of `uri` (replaced in one rename)."""
        make_dirs(self.uri_dir)
        link = self._uri_link(uri, squash_options)
        partial = f"{link}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        os.symlink(f"../images/{key}.sqsh", partial)
        os.replace(partial, link)

    def remembered(self, uri, squash_options):
        """The key last imported for `uri` here, or None."""
        try:
            target = os.readlink(self._uri_link(uri, squash_options))
        except OSError:
            return None
        name = os.path.basename(target)
        return name[:-5] if _IMAGE_NAME.fullmatch(name) else None

    def lookup(self, key, quiet):
        """The entry of `key`, marked used, or None; a damaged one is removed."""
        path = self.path(key)
        try:
            whole = squash.looks_whole(path)
        except FileNotFoundError:
            return None
        if whole:
            touch(path)
            return path
        if not quiet:
            print(f"berth: the cached squashfs {path} is damaged; building it again",
                  file=sys.stderr)
        os.unlink(path)
        return None


# -- berth cache [list] | prune ---------------------------------------------

Entry = collections.namedtuple("Entry", "kind path lock size mtime")


def cmd_cache(args, cfg):
    cache_path = cfg["ENROOT_CACHE_PATH"]
    if args.cache_verb != "prune":
        return _show(cache_path)
    days, limit = _days(args.older_than), _size(args.max_size)
    if days is None and limit is None:
        raise BerthError("cache prune: give --older-than DAYS, --max-size SIZE or both "
                         "(--max-size 0 empties the cache)")
    from berth.layers import remove_stale_unpack_dirs
    for path in remove_stale_unpack_dirs(cfg["ENROOT_TEMP_PATH"]):
        print(f"removed {path} (left by a killed import)")
    try:
        return _prune(cache_path, days, limit)
    except OSError as e:  # another user's cache, say: name the file
        raise BerthError(f"{e.filename}: {e.strerror}") from None


def _days(text):
    if text is None:
        return None
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not (math.isfinite(days) and days >= 0):
        raise BerthError(f"--older-than: expected a number of days, 0 or more, got '{text}'")
    return days


def _size(text):
    if text is None:
        return None
    match = _SIZE.fullmatch(text)
    if not match:
        raise BerthError(f"--max-size: expected bytes or a size such as 500M or 20G, "
                         f"got '{text}'")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " "))


def _human(size):
    for unit in "BKMG":
        if size < 1024:
            break
        size /= 1024
    else:
        unit = "T"
    return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"


def _scan(cache_path):
    """Every file of the layer and image caches, least recently used first."""
    blobs, images = BlobCache(cache_path), ImageCache(cache_path)
    places = ((blobs.blob_dir, _LAYER_NAME, "layers", lambda n: blobs.lock_path(f"sha256:{n}")),
              (images.image_dir, _IMAGE_NAME, "images", lambda n: images.lock_path(n[:-5])))
    entries = []
    for directory, pattern, kind, lock_path in places:
        for item in _files(directory):
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # a partial file just renamed
                continue
            if not pattern.fullmatch(item.name):  # downloads and builds not done (yet)
                entries.append(Entry("partial", item.path, None, info.st_size, info.st_mtime))
            else:
                entries.append(Entry(kind, item.path, lock_path(item.name), info.st_size,
                                     info.st_mtime))
    return sorted(entries, key=lambda entry: entry.mtime)


def _files(directory, links=False):
    try:
        with os.scandir(directory) as items:
            return [item for item in items
                    if (item.is_symlink() if links else item.is_file(follow_symlinks=False))]
    except FileNotFoundError:
        return []


def _show(cache_path):
    entries = _scan(cache_path)
    print(f"ENROOT_CACHE_PATH {cache_path}")
    print(f"{'':<8} {'files':>6} {'size':>8} {'bytes':>14}")
    for kind in (*_KINDS, "total"):
        chosen = [entry for entry in entries if kind in (entry.kind, "total")]
        size = sum(entry.size for entry in chosen)
        print(f"{kind:<8} {len(chosen):>6} {_human(size):>8} {size:>14}")
    return 0


def _prune(cache_path, days, limit):
    entries = _scan(cache_path)
    total = sum(entry.size for entry in entries)
    cutoff = time.time() - days * 86400 if days is not None else None
    freed, kept = collections.Counter(), 0
    for entry in entries:  # least recently used first
        old = cutoff is not None and entry.mtime < cutoff
        # Size alone never takes a partial file: it may be being written.
        over = limit is not None and total > limit and entry.kind != "partial"
        if not (old or over):
            continue
        if not _remove(entry):
            kept += 1
            continue
        total -= entry.size
        freed[entry.kind] += 1
        freed["bytes"] += entry.size
        print(f"removed {entry.path} ({_human(entry.size)}, last used "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry.mtime))})")
    _forget_pruned(cache_path)
    counts = ", ".join(f"{kind} {freed[kind]}" for kind in _KINDS)
    print(f"freed {_human(freed['bytes'])} ({freed['bytes']} bytes: {counts}); "
          f"{kept} in use kept; {_human(total)} ({total} bytes) left")
    return 0


def _forget_pruned(cache_path):
    """Drop the by-URI records of images no longer there."""
    uri_dir = ImageCache(cache_path).uri_dir
    for item in _files(uri_dir, links=True):
        if not os.path.exists(item.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(item.path)


def _remove(entry):
    """Remove `entry` unless an import holds its lock or used it since the scan."""
    if entry.lock is None:
        return _unlink_unchanged(entry)
    try:
        fd = open_lock(entry.lock)
    except FileNotFoundError:  # no lock directory: no import ever locked anything here
        return _unlink_unchanged(entry)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        return _unlink_unchanged(entry)
    finally:
        # Imports make it again when they need it; one of root's must not stay.
        os.unlink(entry.lock)
        os.close(fd)


def _unlink_unchanged(entry):
    try:
        if os.stat(entry.path, follow_symlinks=False).st_mtime != entry.mtime:
            return False  # used since the scan
        os.unlink(entry.path)
    except FileNotFoundError:
        return False
    return True
