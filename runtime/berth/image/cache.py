"""Imported squashfs images kept for reuse, and `berth cache`: a re-run
imports nothing again, and old images do not fill the disk.

$ENROOT_CACHE_PATH/images/<key>.sqsh is the image an import made, under a
key over everything that decides its content: the platform manifest, the
digest and URI its image config records, the squash options and FORMAT.
An import of the same key copies it instead of unpacking the layers again;
a moved tag has a new manifest digest, so a new key. An entry appears only
whole (built beside it, then renamed) and is checked before use, so a
damaged one is built again, never copied out.

Layers and images keep their last use as their mtime, or their atime where
that is later (last_use); `berth cache prune` removes the least recently
used first and skips what an import holds the lock of or used meanwhile;
an entry's empty lock file in locks/ goes with it. Locks only save
duplicate work: every entry is written under a temporary name and renamed,
so no writer corrupts another.
"""

import collections
import contextlib
import copy
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import select
import signal
import stat
import sys
import time

from berth import safedir, units
from berth.errors import BerthError, one_line
from berth.image import squash
from berth.image.blobs import BlobCache, locked, make_dirs, partial_digest, still_at, touch

# Bump when the same inputs would make another image: the image config
# layout (imageconfig.py), the fixed mksquashfs flags (squash.py).
FORMAT = 1
_LAYER_NAME = re.compile(r"[0-9a-f]{64}")
IMAGE_NAME = re.compile(r"[0-9a-f]{64}\.sqsh")
LAYERS_LINK = "layers-"  # the name's start of a record by layers, in uris/
_KINDS = ("layers", "images", "partial")


class ImageCache:
    def __init__(self, cache_path, parted=False):
        self.image_dir = os.path.join(cache_path, "images")
        self.lock_dir = os.path.join(cache_path, "locks")
        # uris/<hash of URI and options> -> ../images/<key>.sqsh: the entry
        # last imported for that URI, for `import --reuse`; dropped by prune.
        # uris/layers-<hash of a run of layer digests> -> the same: the
        # entry last made whose root holds that run (parts.py, base()).
        self.uri_dir = os.path.join(cache_path, "uris")
        # Entries kept as parts (parts.py: --cache-only) have keys and
        # records of their own: `import -o` copies plain ones only.
        self.parted = parted

    def key(self, manifest_digest, digest, uri, squash_options):
        fields = [FORMAT, manifest_digest, digest, uri, squash_options, *self._parted()]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

    def _parted(self):
        return ["parts"] if self.parted else []

    def plain(self):
        """This cache, for an image never kept as parts (a SIF file)."""
        plain = copy.copy(self)
        plain.parted = False
        return plain

    def path(self, key):
        return os.path.join(self.image_dir, f"{key}.sqsh")

    def lock_path(self, key):
        return os.path.join(self.lock_dir, f"image-{key}")

    def locked(self, key, ref, quiet):
        """One import of an image at a time: the second copies what the first built."""
        make_dirs(self.image_dir, self.lock_dir)
        return locked(self.lock_path(key), f"waiting for another import of {ref}", quiet)

    def _uri_link(self, uri, squash_options, arch):
        # The platform too: nodes of two architectures sharing a cache or a
        # store each have their own latest of a multi-arch URI.
        name = hashlib.sha256(json.dumps(
            [FORMAT, uri, squash_options, arch or os.uname().machine, *self._parted()]
        ).encode()).hexdigest()
        return os.path.join(self.uri_dir, name)

    def _layers_link(self, layer_digests, squash_options):
        name = hashlib.sha256(json.dumps(
            [FORMAT, "layers", list(layer_digests), squash_options]).encode()).hexdigest()
        return os.path.join(self.uri_dir, f"{LAYERS_LINK}{name}")

    def remember_layers(self, layer_digests, squash_options, key):
        """Record `key` as the latest entry whose root holds exactly these
        layers (parts.py)."""
        self._link(self._layers_link(layer_digests, squash_options), key)

    def base(self, layer_digests, squash_options, quiet):
        """(path, count): the cached entry, marked used, whose root holds
        the longest run of `layer_digests` from the bottom, and how many of
        them; None when no entry shares even the first layer."""
        for count in range(len(layer_digests), 0, -1):
            try:
                target = os.readlink(self._layers_link(layer_digests[:count], squash_options))
            except OSError:
                continue
            name = os.path.basename(target)
            if IMAGE_NAME.fullmatch(name):
                path = self.lookup(name[:-5], quiet)
                if path is not None:
                    return path, count
        return None

    def remember(self, uri, squash_options, arch, key):
        """Record `key` as the latest image of `uri` for `arch` (--arch; None:
        this machine's), replaced in one rename."""
        self._link(self._uri_link(uri, squash_options, arch), key)

    def _link(self, link, key):
        make_dirs(self.uri_dir)
        partial = f"{link}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        os.symlink(f"../images/{key}.sqsh", partial)
        os.replace(partial, link)

    def remembered(self, uri, squash_options, arch):
        """The key last imported for `uri` and `arch` here, or None."""
        try:
            target = os.readlink(self._uri_link(uri, squash_options, arch))
        except OSError:
            return None
        name = os.path.basename(target)
        return name[:-5] if IMAGE_NAME.fullmatch(name) else None

    def remove_partials(self, key):
        """Remove what a killed build of `key` left beside its entry (the
        squashfs's temporary file). Called with the key's lock held, which
        every build of it holds: none is at work, on this node or another
        sharing the cache. (A pid in the name says nothing across nodes.)"""
        prefix = f"{key}.sqsh.tmp-"
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.image_dir):
                if name.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.image_dir, name))

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

# One file of the cache: `path` to show, `name` in the directory open as
# `dir_fd`, `lock` the name of its lock file in locks/ (None: a partial file
# of no known download);
# `used`, its last use (see last_use), `mtime` to tell a change since the scan.
Entry = collections.namedtuple("Entry", "kind path dir_fd name lock size mtime used")


def last_use(info):
    """The later of the mtime and the atime. An import marks what it uses
    through the mtime; a step that takes an image it may not write (a store's
    entry, by `import --reuse`) reads it, which moves the atime (at most daily
    under relatime; never on a noatime mount, where the mtime alone tells)."""
    return max(info.st_mtime, info.st_atime)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Where each kind lives below the cache, and the name of an entry's lock.
_PLACES = {
    "layers": (("blobs", "sha256"), _LAYER_NAME,
               lambda name: os.path.basename(BlobCache("").lock_path(f"sha256:{name}"))),
    "images": (("images",), IMAGE_NAME,
               lambda name: os.path.basename(ImageCache("").lock_path(name[:-5]))),
}


# `berth cache [list | prune OPTIONS]` (cli.py makes it of the command line)
CacheRequest = collections.namedtuple("CacheRequest", "cache_verb older_than max_size",
                                      defaults=(None, None, None))


def cmd_cache(request, cfg):
    cache_path = cfg["ENROOT_CACHE_PATH"]
    if os.geteuid() != 0:  # (root checks each step itself, then becomes the owner)
        safedir.check_if_present(cache_path, "ENROOT_CACHE_PATH")
    if request.cache_verb != "prune":
        return _show(cache_path)
    older, limit = parse_duration(request.older_than), parse_size(request.max_size)
    if older is None and limit is None:
        raise BerthError("cache prune: give --older-than DURATION, --max-size SIZE or both "
                         "(--max-size 0 empties the cache)")
    from berth.image.layers import remove_stale_unpack_dirs
    for path in remove_stale_unpack_dirs(cfg["ENROOT_TEMP_PATH"]):
        print(f"removed {path} (left by a killed import)", flush=True)  # (before a fork)
    if os.geteuid() == 0:
        return _prune_as_owner(cache_path, older, limit)
    with CacheDirs(cache_path, open_followed(cache_path), strict=True) as cache:
        return _prune(cache, older, limit)


def parse_duration(text):
    """--older-than (cache and store prune) in seconds (units.seconds); None
    stays None."""
    return _parsed(text, units.seconds, "--older-than: expected a duration such as 30d or "
                   "12h (s, m, h, d, w; a number alone is days)")


def parse_size(text):
    """--max-size in bytes (units.size); None stays None."""
    return _parsed(text, units.size, "--max-size: expected bytes or a size such as 500M or 20G")


def _parsed(text, parse, expected):
    if text is None:
        return None
    value = parse(text)
    if value is None:
        raise BerthError(f"{expected}, got '{text}'")
    return value


def human_size(size):
    for unit in "BKMG":
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


# -- the cache's directories, as descriptors ---------------------------------

def open_followed(cache_path):
    """The cache directory as its user names it (a symbolic link there is
    theirs to make); None when there is none yet."""
    try:
        return os.open(cache_path, _DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BerthError(f"{cache_path}: {e.strerror}") from None


def _open_no_links(cache_path):
    """As root: the cache directory reached from / without following any
    symbolic link (safedir.open_no_links), so a user's link cannot lead root
    into another tree; None when it does not exist."""
    if not os.path.isabs(cache_path):
        raise BerthError(f"ENROOT_CACHE_PATH={cache_path}: not an absolute path")
    try:
        return safedir.open_no_links(os.path.normpath(cache_path))
    except safedir.Unreachable as e:
        if isinstance(e.error, FileNotFoundError):
            return None
        if e.link:
            raise BerthError(
                f"ENROOT_CACHE_PATH={cache_path}: {e.path} is a symbolic link; as root, "
                "berth cache prune follows none (give the resolved path)") from None
        raise


class CacheDirs:
    """The cache's directories, each opened once (None: not there).

    strict (prune): a directory below the cache that is a symbolic link, not
    a directory or not the caller's is refused in one line naming it, before
    anything is removed; nothing later follows a link out of the cache.
    """

    PRUNE, PLACE = "berth cache prune", "the cache"  # who refuses, and where, in messages

    def __init__(self, cache_path, cache_fd, strict):
        self.path, self.fds = cache_path, {}
        try:
            for kind, parts in (("layers", ("blobs", "sha256")), ("images", ("images",)),
                                ("locks", ("locks",)), ("uris", ("uris",))):
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
        return os.path.join(self.path, *{"layers": ("blobs", "sha256")}.get(kind, (kind,)))

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
    """Every file of the layer and image caches, least recently used first
    (last_use: an import marks the layers it uses, a lookup the image it
    hands out, a step's read the image it mounts)."""
    entries = []
    for kind, (_, pattern, lock_name) in _PLACES.items():
        fd, directory = cache.fds[kind], cache.dir_path(kind)
        for item in files(fd):
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # a partial file just renamed
                continue
            path = os.path.join(directory, item.name)
            if not pattern.fullmatch(item.name):  # downloads and builds not done (yet)
                # a download's file goes under its digest's lock: only when no import writes it
                digest = partial_digest(item.name) if kind == "layers" else None
                lock = lock_name(digest.split(":", 1)[1]) if digest else None
                entries.append(Entry("partial", path, fd, item.name, lock, info.st_size,
                                     info.st_mtime, last_use(info)))
            else:
                entries.append(Entry(kind, path, fd, item.name, lock_name(item.name),
                                     info.st_size, info.st_mtime, last_use(info)))
    return sorted(entries, key=lambda entry: entry.used)


def files(dir_fd, links=False):
    if dir_fd is None:
        return []
    with os.scandir(dir_fd) as items:
        return [item for item in items
                if (item.is_symlink() if links else item.is_file(follow_symlinks=False))]


def _show(cache_path):
    with CacheDirs(cache_path, open_followed(cache_path), strict=False) as cache:
        entries = scan(cache)
    print(f"ENROOT_CACHE_PATH {cache_path}")
    print(f"{'':<8} {'files':>6} {'size':>8} {'bytes':>14}")
    for kind in (*_KINDS, "total"):
        chosen = [entry for entry in entries if kind in (entry.kind, "total")]
        size = sum(entry.size for entry in chosen)
        print(f"{kind:<8} {len(chosen):>6} {human_size(size):>8} {size:>14}")
    return 0


# -- prune --------------------------------------------------------------------

# How long root waits for the child pruning a user's cache as that user: the
# user may stop it (SIGSTOP, a FUSE mount that never answers), and the
# timer's other caches wait behind it.
PRUNE_AS_OWNER_SECONDS = 600


def _prune_as_owner(cache_path, older, limit):
    """As root: prune a user's cache as that user, in a child that became them
    (groups, gid, uid), killed after PRUNE_AS_OWNER_SECONDS; root's own
    cache as root."""
    cache_fd = _open_no_links(cache_path)
    owner = os.fstat(cache_fd) if cache_fd is not None else None
    if owner is None or owner.st_uid == 0:
        with CacheDirs(cache_path, cache_fd, strict=True) as cache:
            return _prune(cache, older, limit)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            _become(owner.st_uid, owner.st_gid)
            with CacheDirs(cache_path, cache_fd, strict=True) as cache:
                status = _prune(cache, older, limit)
        except BerthError as e:
            print(f"berth: error: {one_line(str(e))}", file=sys.stderr)
        except BaseException:  # noqa: B036 - the child must reach os._exit
            import traceback  # (only here: its import costs every cached step)
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    os.close(cache_fd)
    ended = _ends_within(pid, PRUNE_AS_OWNER_SECONDS)
    if not ended:  # our own child, not reaped yet: its pid is not reused
        os.kill(pid, signal.SIGKILL)
    _, wait_status = os.waitpid(pid, 0)
    if not ended:
        raise BerthError(f"cache prune of {cache_path}: the process pruning it as uid "
                         f"{owner.st_uid} did not end within {PRUNE_AS_OWNER_SECONDS} s; "
                         "killed it")
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 1


def _ends_within(pid, seconds):
    """Whether the child `pid` ends within `seconds` (it is not reaped)."""
    pidfd = os.pidfd_open(pid)
    try:
        return bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)


def _become(uid, gid):
    """Drop root for good: the owner's groups, then gid, then uid (all three ids)."""
    try:
        user = pwd.getpwuid(uid)
    except KeyError:  # a user gone from passwd: their uid, the directory's group, no others
        os.setgroups([])
    else:
        os.initgroups(user.pw_name, user.pw_gid)
        gid = user.pw_gid
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _prune(cache, older, limit):
    entries = scan(cache)
    total = sum(entry.size for entry in entries)
    cutoff = time.time() - older if older is not None else None
    freed, kept = collections.Counter(), 0
    for entry in entries:  # least recently used first
        old = cutoff is not None and entry.used < cutoff
        # Size alone never takes a partial file: it may be being written. A
        # download's goes whatever its age or size once no import holds its
        # digest's lock (_remove): a killed import left it.
        over = limit is not None and total > limit and entry.kind != "partial"
        left_behind = entry.kind == "partial" and entry.lock is not None
        if not (old or over or left_behind):
            continue
        if not _remove(entry, cache):
            kept += 1
            continue
        total -= entry.size
        freed[entry.kind] += 1
        freed["bytes"] += entry.size
        print(f"removed {entry.path} ({human_size(entry.size)}, last used "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry.used))})")
    _forget_pruned(cache.fds["uris"])
    counts = ", ".join(f"{kind} {freed[kind]}" for kind in _KINDS)
    print(f"freed {human_size(freed['bytes'])} ({freed['bytes']} bytes: {counts}); "
          f"{kept} in use kept; {human_size(total)} ({total} bytes) left")
    return 0


def _forget_pruned(uri_fd):
    """Drop the by-URI records of images no longer there."""
    for item in files(uri_fd, links=True):
        try:
            os.stat(item.name, dir_fd=uri_fd)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.unlink(item.name, dir_fd=uri_fd)
        except OSError:  # a loop, say: the user's own making, left alone
            continue


def _remove(entry, cache):
    """Remove `entry` unless an import holds its lock or used it since the scan."""
    if entry.lock is None:
        return unlink_unchanged(entry)
    with holding(cache, entry.lock) as held:
        return held and unlink_unchanged(entry) and remove_lock(cache, entry.lock)


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
