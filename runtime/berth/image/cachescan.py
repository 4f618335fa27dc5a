"""An image cache's files read through descriptors: its directories opened
once (CacheDirs), every file of its layer and image caches found with its
last use (scan), and each removed only where it is what was scanned, with
its lock held (holding, unlink_unchanged, remove_lock). `berth cache`
(verbs.py), `berth store list` and `berth store prune` go through these, so
that a symbolic link in a cache is removed as a link, never followed.
"""

import collections
import contextlib
import errno
import fcntl
import os
import stat

from berth import safedir
from berth.errors import BerthError
from berth.image.blobs import partial_digest, still_at
from berth.image.cachelayout import LAYER_NAME, CacheLayout

# One file of the cache: `path` to show, `name` in the directory open as
# `dir_fd`, `lock` the name of its lock file in locks/ (None: a partial file
# of no known download);
# `used`, its last use (see last_use), `mtime` to tell a change since the scan.
Entry = collections.namedtuple("Entry", "kind path dir_fd name lock size mtime used")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Whether a name is a whole file's of each kind, and the name of its lock.
_NAMES = {
    "layers": (lambda name: LAYER_NAME.fullmatch(name) is not None,
               lambda name: CacheLayout.layer_lock_name(f"sha256:{name}")),
    "images": (lambda name: CacheLayout.key_of(name) is not None,
               lambda name: CacheLayout.image_lock_name(CacheLayout.key_of(name))),
}


def last_use(info):
    """The later of the mtime and the atime. An import marks what it uses
    through the mtime; a step that takes an image it may not write (a store's
    entry, by `import --reuse`) reads it, which moves the atime (at most daily
    under relatime; never on a noatime mount, where the mtime alone tells)."""
    return max(info.st_mtime, info.st_atime)


def open_followed(cache_path):
    """The cache directory as its user names it (a symbolic link there is
    theirs to make); None when there is none yet."""
    try:
        return os.open(cache_path, _DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BerthError(f"{cache_path}: {e.strerror}") from None


class CacheDirs:
    """The cache's directories, each opened once (None: not there).

    strict (prune): a directory below the cache that is a symbolic link, not
    a directory or not the caller's is refused in one line naming it, before
    anything is removed; nothing later follows a link out of the cache.
    """

    PRUNE, PLACE = "berth cache prune", "the cache"  # who refuses, and where, in messages

    def __init__(self, cache_path, cache_fd, strict):
        self.path, self.fds = cache_path, {}
        self.layout = CacheLayout(cache_path)
        try:
            for kind, parts in CacheLayout.PLACES.items():
                # a listing takes no lock (a store's locks/ is its account's alone)
                self.fds[kind] = self._open(cache_fd, parts, strict) \
                    if strict or kind != "locks" else None
        except BaseException:
            self.close()
            raise
        finally:
            if cache_fd is not None:
                os.close(cache_fd)

    def _open(self, fd, parts, strict):
        path, own = self.path, False
        try:
            for name in parts:
                if fd is None:
                    return None
                path = os.path.join(path, name)
                try:
                    new = os.open(name, _DIR | (os.O_NOFOLLOW if strict else 0), dir_fd=fd)
                except FileNotFoundError:
                    new = None
                except OSError as e:
                    if strict and safedir.is_link(name, fd):
                        raise BerthError(f"{path}: a symbolic link; {self.PRUNE} follows "
                                         f"none in {self.PLACE}") from None
                    raise BerthError(f"{path}: {e.strerror}") from None
                if own:
                    os.close(fd)
                fd, own = new, True
                if fd is not None and strict and os.fstat(fd).st_uid != os.geteuid():
                    raise BerthError(f"{path}: owned by uid {os.fstat(fd).st_uid}, not uid "
                                     f"{os.geteuid()}; {self.PRUNE} leaves it alone")
            own = False
            return fd
        finally:
            if own and fd is not None:
                os.close(fd)

    def dir_path(self, kind):
        return self.layout.dir(kind)

    def close(self):
        for fd in self.fds.values():
            if fd is not None:
                os.close(fd)
        self.fds = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def scan(cache):
    """Every file of the layer and image caches of the CacheDirs `cache`,
    least recently used first (last_use: an import marks the layers it uses,
    a lookup the image it hands out, a step's read the image it mounts)."""
    entries = []
    for kind, (whole, lock_name) in _NAMES.items():
        fd, directory = cache.fds[kind], cache.dir_path(kind)
        for item in files(fd):
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # a partial file just renamed
                continue
            path = os.path.join(directory, item.name)
            if whole(item.name):
                found, lock = kind, lock_name(item.name)
            else:  # downloads and builds not done (yet)
                # a download's file goes under its digest's lock: only when no import writes it
                digest = partial_digest(item.name) if kind == "layers" else None
                found, lock = "partial", lock_name(digest.split(":", 1)[1]) if digest else None
            entries.append(Entry(kind=found, path=path, dir_fd=fd, name=item.name, lock=lock,
                                 size=info.st_size, mtime=info.st_mtime, used=last_use(info)))
    return sorted(entries, key=lambda entry: entry.used)


def files(dir_fd, links=False):
    """The files (with links: the symbolic links) of the directory open as
    `dir_fd`; none where it is None."""
    if dir_fd is None:
        return []
    with os.scandir(dir_fd) as items:
        return [item for item in items
                if (item.is_symlink() if links else item.is_file(follow_symlinks=False))]


def disk_usage(dir_fd):
    """The bytes on disk of every entry under the directory open as
    `dir_fd`, walked without following a link (an entry gone meanwhile
    counts nothing)."""
    total = 0
    for _, dirs, names, top_fd in os.fwalk(dir_fd=dir_fd):
        for name in dirs + names:
            with contextlib.suppress(OSError):
                total += os.stat(name, dir_fd=top_fd, follow_symlinks=False).st_blocks * 512
    return total


def holds_file(dir_fd, name):
    """Whether the directory open as `dir_fd` (None: not there) holds the
    regular file `name`; a symbolic link is none."""
    if dir_fd is None:
        return False
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def remove_lock(cache, lock):
    """Remove the lock file of an entry just removed, with its lock held
    (True). An import waiting on it finds it gone once it gets it, and takes
    the file a later import made instead (blobs.locked)."""
    if cache.fds["locks"] is not None:  # (None: no locks/, nothing locked)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock, dir_fd=cache.fds["locks"])
    return True


@contextlib.contextmanager
def holding(cache, lock):
    """Whether the lock file `lock` of locks/ (made when missing) is ours for
    the body: False while an import holds it, when it is no lock file, or
    when it left locks/ while we took it.
    With no locks/ no import ever locked anything: True."""
    lock_fd = cache.fds["locks"]
    if lock_fd is None:
        yield True
        return
    try:
        # The lock file, in locks/ itself: never through a symbolic link, and
        # not a FIFO that would block.
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644, dir_fd=lock_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise BerthError(f"{cache.dir_path('locks')}/{lock}: {e.strerror}") from None
        yield False  # not a lock file: what it locks stays
        return
    try:
        # and still the file in locks/: prune may have removed it meanwhile
        yield stat.S_ISREG(os.fstat(fd).st_mode) and _try_lock(fd) \
            and still_at(fd, lock, dir_fd=lock_fd)
    finally:
        os.close(fd)


def _try_lock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlink_unchanged(entry):
    """Unlink `entry` unless it is gone or was used since the scan."""
    try:
        if os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False).st_mtime \
                != entry.mtime:
            return False  # used since the scan
        os.unlink(entry.name, dir_fd=entry.dir_fd)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise BerthError(f"{entry.path}: {e.strerror}") from None
    return True


def remove_unused(cache, entry):
    """Whether `entry` went: unused since the scan and, where imports lock
    it, with its lock held; its lock file with it (see remove_lock)."""
    if entry.lock is None:
        return unlink_unchanged(entry)
    with holding(cache, entry.lock) as held:
        return held and unlink_unchanged(entry) and remove_lock(cache, entry.lock)
