"""The content-addressed layer cache: $ENROOT_CACHE_PATH/blobs/sha256/<hex>.

A blob appears under its name only after its digest was verified (it is
written to a temporary file in the same directory, then renamed), so a
reader never sees a partial layer. One lock per digest keeps concurrent
imports on a node from downloading the same layer twice. A blob's mtime is
its last use: `berth cache prune` removes the least recently used first.

Downloads run in threads; cancel() (a failure elsewhere, SIGTERM) removes
the temporary files of those under way at once and refuses new ones, so an
interrupted import leaves no partial blob even while a thread still waits
on a registry that does not answer. A temporary file is named after its
digest (PARTIAL_PREFIX + hex + "."): one that a killed import left behind
goes with the next download of that digest, or with `berth cache prune`,
either holding the digest's lock, so never while another import writes it.
"""

import contextlib
import errno
import fcntl
import os
import sys
import threading

from berth.errors import BerthError
from berth.image.cachelayout import CacheLayout
from berth.image.reference import DIGEST

PARTIAL_PREFIX = ".partial-"  # a download's temporary file, beside the blobs


def partial_digest(name):
    """The digest a download's temporary file `name` was for, or None."""
    hex_part, dot, _ = name[len(PARTIAL_PREFIX):].partition(".")
    if name.startswith(PARTIAL_PREFIX) and dot and DIGEST.fullmatch(f"sha256:{hex_part}"):
        return f"sha256:{hex_part}"
    return None


class BlobCache:
    def __init__(self, cache_path):
        self.layout = CacheLayout(cache_path)
        self.blob_dir, self.lock_dir = self.layout.dir("layers"), self.layout.dir("locks")
        self._guard = threading.Lock()
        self._partials = set()  # temporary files of the downloads under way
        self._cancelled = False

    def cancel(self):
        """Stop: remove the temporary files of the downloads under way, start no more."""
        with self._guard:
            self._cancelled = True
            for partial in self._partials:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
            self._partials.clear()

    def path(self, digest):
        # The digest comes from a manifest: never let it name another path.
        if not DIGEST.fullmatch(digest):
            raise BerthError(f"unsupported layer digest '{digest}' (expected sha256:<64 hex>)")
        return os.path.join(self.blob_dir, digest.split(":", 1)[1])

    def lock_path(self, digest):
        return self.layout.layer_lock(digest)

    def has(self, digest):
        return os.path.isfile(self.path(digest))

    def use(self, digest):
        """Whether `digest` is cached, marking it used if so."""
        return self.has(digest) and touch(self.path(digest))

    def fetch(self, digest, size, registry, on_bytes, quiet=True):
        """Download `digest` (`size` bytes, as its manifest declares) unless
        cached; returns True when it downloaded."""
        if self.has(digest):
            return False
        make_dirs(self.blob_dir, self.lock_dir)
        with locked(self.lock_path(digest), f"waiting for another import downloading {digest}",
                    quiet):
            if self.has(digest):  # another import fetched it while we waited
                return False
            self._remove_left_behind(digest)
            with self._guard:
                if self._cancelled:
                    raise BerthError("download cancelled")
                import tempfile  # (only for a download: not on a cached step's way)
                fd, partial = tempfile.mkstemp(
                    dir=self.blob_dir, prefix=f"{PARTIAL_PREFIX}{digest.split(':', 1)[1]}.")
                self._partials.add(partial)
            try:
                with os.fdopen(fd, "wb") as out:
                    got = registry.download(digest, size, out, on_bytes)
                    out.flush()
                    os.fsync(out.fileno())
                if got != digest:
                    raise BerthError(f"layer digest mismatch: expected {digest}, got {got}")
                with self._guard:
                    if self._cancelled:
                        raise BerthError("download cancelled")
                    os.rename(partial, self.path(digest))
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)
                raise
            finally:
                with self._guard:
                    self._partials.discard(partial)
        return True

    def _remove_left_behind(self, digest):
        """Remove the temporary files of `digest` that a killed download left:
        with its lock held, no other import writes one."""
        with os.scandir(self.blob_dir) as items:
            stale = [item.name for item in items if partial_digest(item.name) == digest]
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.blob_dir, name))


def make_dirs(*directories):
    for directory in directories:
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as e:
            raise BerthError(f"cannot create cache directory {directory}: "
                             f"{e.strerror}") from None


def open_lock(lock_path):
    """A descriptor to flock. Read-only and 0644, so that a lock file an
    admin's `berth cache prune` made for a moment never locks the user out."""
    return os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o644)


@contextlib.contextmanager
def locked(lock_path, waiting, quiet):
    """Hold the lock `lock_path`; say `waiting` when another process has it.
    In a cache this user may not write (a read-only mount, an admin's) there
    is no lock to take: the import only reads from it, and a missing entry
    then fails where it would be written, naming the path. Prune removes the
    lock file of an entry it removed, while holding it: a lock taken on a
    file no longer at `lock_path` is let go and the file there taken
    instead, so that this import and one that came after the removal never
    build the same entry side by side."""
    said = quiet
    while True:
        try:
            fd = open_lock(lock_path)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said:
                    print(f"berth: {waiting}", file=sys.stderr)
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if still_at(fd, lock_path):
                yield
                return
        finally:
            os.close(fd)


def still_at(fd, path, dir_fd=None):
    """Whether the file open as `fd` is still the one at `path` (a lock file
    prune may have removed, or removed and another import made again)."""
    try:
        there = os.stat(path, dir_fd=dir_fd)  # followed, as open_lock follows
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def touch(path):
    """Mark `path` used now; False when it is gone. A cache we may read but
    not write still serves, unmarked."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return True
