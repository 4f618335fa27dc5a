"""`berth cache [list] | prune`: the layers and images of ENROOT_CACHE_PATH
(and the steps and cache mounts builds keep) counted, or the least
recently used removed (skipping what an import holds the lock of or used
meanwhile; an entry's empty lock file in locks/ goes with it). The cache
is read through cachescan.py's descriptors; as root, a user's cache is
pruned in a child that became its owner.
"""

import collections
import contextlib
import os
import pwd
import select
import signal
import sys
import time

from berth import safedir, units
from berth.errors import BerthError, one_line
from berth.image.buildrecords import forget_gone, mounts_held, steps_held
from berth.image.cachescan import (
    CacheDirs,
    files,
    open_followed,
    remove_unused,
    scan,
)
from berth.units import human_size

_KINDS = ("layers", "images", "partial")

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


def _show(cache_path):
    """The table: the cache's files by kind and their total, then what
    builds keep: the steps (their layers among the layers) and the cache
    mounts (directories, apart from the total)."""
    with CacheDirs(cache_path, open_followed(cache_path), strict=False) as cache:
        entries = scan(cache)
        steps, mounts = steps_held(cache), mounts_held(cache)
    print(f"ENROOT_CACHE_PATH {cache_path}")
    print(f"{'':<8} {'files':>6} {'size':>8} {'bytes':>14}")
    for kind in (*_KINDS, "total"):
        chosen = [entry for entry in entries if kind in (entry.kind, "total")]
        _row(kind, len(chosen), sum(entry.size for entry in chosen))
    _row("steps", steps.count, steps.size)
    _row("mounts", mounts.count, mounts.size)
    return 0


def _row(kind, count, size):
    print(f"{kind:<8} {count:>6} {human_size(size):>8} {size:>14}")


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
        if not remove_unused(cache, entry):
            kept += 1
            continue
        total -= entry.size
        freed[entry.kind] += 1
        freed["bytes"] += entry.size
        print(f"removed {entry.path} ({human_size(entry.size)}, last used "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry.used))})")
    _forget_pruned(cache.fds["uris"])
    forgotten = forget_gone(cache, cutoff)
    if any(forgotten):
        print(f"forgot {forgotten.layer_records} build step, {forgotten.sum_records} COPY "
              f"--from checksum and {forgotten.url_records} ADD URL records of layers or "
              "images no longer cached")
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
