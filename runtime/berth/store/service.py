"""The store's side of the shared image store (paths.py).

`berth store serve` is the store's side: systemd starts one per connection
to the store's socket (Accept=yes, the connection as stdin and stdout), as
BERTH_IMAGE_STORE_OWNER. It reads one request line, a registry reference,
imports it into BERTH_IMAGE_STORE as `import --cache-only` would, with the
admin's enroot.conf and registries.conf and without any credentials, and
answers one line:

    ok PATH            the store's entry (images/<key>.sqsh), or this
                       node's copy of it with BERTH_IMAGE_STORE_LOCAL
                       (local.py)
    private REASON     the registry wants credentials (401, 403, or a 404
                       that may hide a private repository)
    busy REASON        the user asking has used her share of the store
                       (PER_USER_CONNECTIONS, IMPORTS_PER_HOUR,
                       IMPORT_BYTES_PER_HOUR): she imports into her own cache
    error REASON       anything else (a refused request, a blocked registry,
                       a broken image)

The user's side is client.py.
"""

import contextlib
import os
import select
import signal
import stat
import sys
import time

from berth import safedir, units
from berth.errors import AccessDenied, BerthError, ImageNotFound, Terminated, raise_terminated
from berth.image import archive, parts, reference, squash
from berth.image.cache import ImageCache
from berth.image.request import PullRequest
from berth.store.paths import configured_path, local_limit, local_path, owned_store
from berth.units import human_size

REQUEST_MAX = 4096  # bytes of a request line, its newline not counted
REQUEST_TIMEOUT = 30  # seconds a connection has to send its request
# Connections one user may hold open on a node at once: the socket runs a
# few imports at a time for everyone, and idle connections renewed every
# REQUEST_TIMEOUT would otherwise take every one of them.
PER_USER_CONNECTIONS = 4
# What one user may make the store import, over the last hour and the whole
# store (every node's requests): each new entry counts for the user whose
# request built it, with its size. Past either, her requests are answered
# busy until the hour has moved on; an entry already there costs nothing,
# and root's requests (the admin's pre-staging) are not counted.
IMPORTS_PER_HOUR = 20
IMPORT_BYTES_PER_HOUR = 100 << 30
# Each directory of the store and its mode. locks/ is the account's alone:
# a user who could open a lock file could hold its flock for ever, and
# with it every import of that image, its node-local copies and the prune.
_DIRS = ((("images",), 0o755), (("blobs",), 0o755), (("blobs", "sha256"), 0o755),
         (("locks",), 0o700), (("uris",), 0o755), (("users",), 0o700))


def serve(cfg):
    """One request, one answer line on stdout; the reason of an error on
    stderr (the journal) too."""
    signal.signal(signal.SIGTERM, raise_terminated)
    os.umask(0o022)
    try:
        kind, text = "ok", _serve_request(cfg)
    except (AccessDenied, ImageNotFound) as e:  # may be there for those who log in
        kind, text = "private", str(e)
    except _Busy as e:
        kind, text = "busy", str(e)
    except BerthError as e:
        kind, text = "error", str(e)
    except Terminated:
        kind, text = "error", "the image store's import was interrupted by SIGTERM"
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        kind, text = "error", f"{where}{e.strerror or e}"
    text = " ".join(text.split())  # one line, whatever the reason held
    _drain(sys.stdin.fileno())
    _answer(f"{kind} {text}")
    if kind in ("error", "busy"):
        raise BerthError(f"store serve: {text}")
    _sweep(cfg)
    return 0


def _answer(line):
    """Send the answer `line` to the client (stdout, the connection). One
    that went away (killed, or past its BERTH_IMAGE_STORE_TIMEOUT) is said
    in one line on stderr; what the import made stays in the store. stdout
    then goes to /dev/null: the answer the failed write left in its buffer
    would fail again at exit, as Python's `Exception ignored` lines."""
    try:
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()
    except OSError as e:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        print(f"berth: store serve: the client went away before its answer ({e.strerror}): "
              f"{line}", file=sys.stderr)


def _sweep(cfg):
    """Once the client has its answer: this node's copies of entries the
    store no longer holds go (local.sweep)."""
    from berth.store import local
    try:
        local.sweep(cfg, configured_path(cfg))
    except (BerthError, OSError) as e:
        print(f"berth: store serve: the node-local copies: {e}", file=sys.stderr)


def _drain(fd, most=1 << 20):
    """Read what the client sent past its request (bounded): a socket closed
    with unread data resets the connection, and the answer with it."""
    with contextlib.suppress(OSError, ValueError):
        while most > 0 and select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, min(most, 1 << 16))
            if not chunk:
                return
            most -= len(chunk)


def _serve_request(cfg):
    store = owned_store(cfg, "berth store serve")
    uid = _take_slot(cfg, sys.stdin.fileno())
    uri = _request(sys.stdin.fileno())
    ref = _registry_reference(uri)
    _make_store(store)
    local_path(cfg)  # wrong node-local copy settings: refused before any import
    local_limit(cfg)
    image = _import(cfg, uri, ref=ref, store=store, uid=uid)
    from berth.store import local
    return local.copied(cfg, image)


def _take_slot(cfg, fd):
    """Hold one of the connecting user's PER_USER_CONNECTIONS slots for as
    long as this process lives: a flock on slots/UID.N in ENROOT_TEMP_PATH
    (the unit's state directory: node-local, the store account's). None
    free: refused before the request is read. Returns the user's uid, or
    None for a connection that is no socket (a serve run by hand), which
    holds no slot; slots that cannot be kept are said in the journal and
    the request served (never every request refused for the node's sake)."""
    import fcntl
    import socket
    import struct
    try:
        with socket.socket(fileno=os.dup(fd)) as peer:
            _, uid, _ = struct.unpack("3i", peer.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return None
    slots = os.path.join(cfg["ENROOT_TEMP_PATH"], "slots")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(slots, 0o700)
        safedir.check(slots, "the store's connection slots")
        for number in range(PER_USER_CONNECTIONS):
            slot = os.open(os.path.join(slots, f"{uid}.{number}"),
                           os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid  # this slot stays open, and locked, until the process ends
            except BlockingIOError:
                os.close(slot)
    except (OSError, BerthError) as e:
        print(f"berth: store serve: no connection slots ({e}); serving uid {uid} "
              "without counting", file=sys.stderr)
        return uid
    raise _Busy(f"uid {uid} has {PER_USER_CONNECTIONS} requests open on this node already")


class _Busy(BerthError):
    """The connecting user has used her share: answered `busy`, and the
    client imports into its user's own cache."""


@contextlib.contextmanager
def _counted(store, uid, image):
    """A new entry built for `uid`, within her hourly share: refused (busy)
    when she used it, else written down in users/UID (one line per import
    of the last hour: its start time, the pid that builds it and its size,
    0 until built) before the build and its size after."""
    if uid in (None, 0):  # a serve run by hand, or the admin's pre-staging
        yield
        return
    started, pid = int(time.time()), os.getpid()
    with _imports_of(store, uid) as imports:
        count, size = len(imports), sum(row[2] for row in imports)
        if count >= IMPORTS_PER_HOUR or size >= IMPORT_BYTES_PER_HOUR:
            raise _Busy(f"uid {uid} used its hourly share of the store's imports "
                        f"({IMPORTS_PER_HOUR} images or {human_size(IMPORT_BYTES_PER_HOUR)}): "
                        f"{count}, {human_size(size)}, in the last hour")
        imports.append((started, pid, 0))
    yield
    with _imports_of(store, uid) as imports:
        built = (started, pid, os.stat(image).st_size)
        imports[:] = [built if row[:2] == built[:2] else row for row in imports]


@contextlib.contextmanager
def _imports_of(store, uid):
    """users/UID's imports of the last hour as a list of (start, pid, size),
    the file locked; written back as the list is left. Lines that are not
    three numbers are dropped (a write cut short by a crash)."""
    import fcntl
    fd = os.open(os.path.join(store, "users", str(uid)),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+", encoding="ascii", errors="replace") as f:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (held for a read and a write of a few lines)
        hour_ago, imports = time.time() - 3600, []
        for line in f.read(1 << 20).splitlines():
            fields = line.split()
            row = tuple(map(units.whole, fields))
            if len(row) == 3 and None not in row:
                if row[0] > hour_ago:
                    imports.append(row)
        yield imports
        f.seek(0)
        f.truncate()
        f.write("".join(f"{start} {pid} {size}\n" for start, pid, size in imports))

def _request(fd):
    """The request line: at most REQUEST_MAX bytes of UTF-8 text, ended by a
    newline or the end of the stream, and nothing after it."""
    data, deadline, ended = b"", time.monotonic() + REQUEST_TIMEOUT, False
    while b"\n" not in data and len(data) <= REQUEST_MAX:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise BerthError(f"no request line within {REQUEST_TIMEOUT} s")
        chunk = os.read(fd, REQUEST_MAX + 2 - len(data))
        if not chunk:
            ended = True
            break
        data += chunk
    line, newline, rest = data.partition(b"\n")
    if len(line) > REQUEST_MAX:
        raise BerthError(f"the request is longer than {REQUEST_MAX} bytes")
    if newline and not ended and not rest and select.select([fd], [], [], 0)[0]:
        rest = os.read(fd, 1)
    if rest:
        raise BerthError("the request is more than one line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise BerthError("the request is not UTF-8 text") from None
    if not text:
        raise BerthError("empty request: send one registry reference")
    if not text.isprintable():
        raise BerthError("the request holds control characters")
    return text


def _registry_reference(uri):
    if archive.is_archive(uri):
        raise BerthError(f"{uri[:200]}: the image store imports registry images only, "
                         "no archives")
    ref = reference.parse(uri)
    if ref.user:
        raise BerthError(f"{uri}: the image store pulls without credentials; a reference "
                         "with USER@ is imported into the user's own cache")
    return ref


def _make_store(store):
    """The store's directories, the account's: 0755 where every user reads
    (nobody else writes), locks/ 0700 (set again on a store made before).
    (The import itself would make them 0700.)"""
    for names, mode in (((), 0o755), *_DIRS):
        path = os.path.join(store, *names)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
        safedir.check(path, "BERTH_IMAGE_STORE" if not names else "the image store's directory")
        current = stat.S_IMODE(os.stat(path).st_mode)
        if (current & 0o077) if mode == 0o700 else (current & 0o055 != 0o055):
            os.chmod(path, mode)


def _import(cfg, uri, *, ref, store, uid):
    """`berth import --cache-only --quiet URI` into the store, anonymously,
    counted as `uid`'s (_counted), unpacking within the node's free floor."""
    from berth.image import pull  # (the HTTP stack: only where a request is made)
    store_cfg = _store_config(cfg, store)
    # blocked: refused; no credentials: only what the registry gives anyone goes in
    resolved = pull.resolve(PullRequest(uri, quiet=True), cfg=store_cfg, ref=ref,
                            anonymous=True)
    options = squash.options(cfg)
    images = ImageCache(store, parts.wanted(True, options))
    with pull.build_cached(resolved, cfg=store_cfg, images=images, options=options,
                           building=lambda image: _counted(store, uid, image),
                           keep_free=True) as image:
        return image.path


def _store_config(cfg, store):
    from berth.config import Config
    # ENROOT_CONFIG_PATH is never read here (no .credentials): it names
    # nothing, so that a later change that reads it finds no file.
    return Config({**dict(cfg.items()), "ENROOT_CACHE_PATH": store,
                   "ENROOT_CONFIG_PATH": "/nonexistent/berth-store"})
