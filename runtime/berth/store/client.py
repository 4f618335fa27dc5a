"""The user's side of the shared image store (paths.py), in `berth import
--cache-only` (image/importer.py, which cli.py hands a SharedStore, the
image part's StoreClient): ask() the store's socket for an entry, or take
the one last imported there with --reuse (reused()). Nothing on the user's
side writes in the store: no lock, no mark of use but a read, no removal.
"""

import contextlib
import os
import sys
import time

from berth.errors import BerthError
from berth.image import parts, reference
from berth.image.cache import ImageCache
from berth.image.cachelayout import CacheLayout
from berth.image.request import StoreClient
from berth.store.paths import entry, local_path, path_of

_ANSWER_MAX = 8192  # "ok " and a path; more is not an answer of ours


class SharedStore(StoreClient):
    """This module's functions as the image part asks for them."""

    def serves(self, request, cfg, ref):
        return serves(request, cfg, ref)

    def reused(self, cfg, uri, options, *, quiet):
        return reused(cfg, uri, options, quiet=quiet)

    def ask(self, cfg, uri, quiet):
        return ask(cfg, uri, quiet)


def serves(request, cfg, ref):
    """Whether this import (an image.request.ImportRequest) goes through the
    store: --cache-only of a registry reference without USER@ (the store
    pulls anonymously) for this node's platform, with a store configured."""
    if not (request.cache_only and isinstance(ref, reference.Reference) and not ref.user
            and not request.arch):
        return False
    if path_of(cfg) is None:
        local_path(cfg)  # set without a store: refused, naming it
        return False
    return True


def reused(cfg, uri, options, *, quiet):
    """For --reuse: the store's entry last imported for `uri`, checked, or
    None. With BERTH_IMAGE_STORE_LOCAL, this node's copy of it, or None
    (the socket makes the copy). Reads only: the store is not the caller's
    to mark or repair."""
    store, local = path_of(cfg), local_path(cfg)
    images = ImageCache(store, parts.wanted(True, options))
    key = images.remembered(uri, options, None)  # (the store serves this node's platform)
    if key is None:
        return None
    path = images.path(key) if local is None else os.path.join(local, CacheLayout.image_name(key))
    if not os.path.lexists(path):
        return None
    try:
        found = entry(cfg, path)
    except BerthError as e:
        if not quiet:
            print(f"berth: not reusing the image store's entry of {uri}: {e}", file=sys.stderr)
        return None
    if local is not None and not _mark(images.path(key)):
        return None  # pruned from the store: the socket imports it again
    return found


def _mark(image):
    """Read the first block of the store's entry `image`, as a step mounting
    it would: its atime tells prune it is in use (under relatime, at most once
    a day). False when the store no longer has it."""
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # (a mark is worth no failed step)
    try:
        with contextlib.suppress(OSError):
            os.read(fd, 4096)
    finally:
        os.close(fd)
    return True


def ask(cfg, uri, quiet):
    """The store's entry of `uri`, asked of the store's socket; None when
    the caller must import into its own cache (said on stderr unless
    quiet). Waits as long as the import takes, up to
    BERTH_IMAGE_STORE_TIMEOUT seconds (then says so, quiet or not)."""
    import socket  # (only here: not on a cached step's way)
    path = cfg["BERTH_IMAGE_STORE_SOCKET"]
    seconds = cfg.number("BERTH_IMAGE_STORE_TIMEOUT")
    deadline = time.monotonic() + seconds
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(seconds)
        try:
            sock.connect(path)
        except TimeoutError:
            return _gave_up(path, seconds)
        except OSError as e:
            return _own_cache(quiet, f"no image store answers at {path} ({e.strerror or e})")
        with contextlib.suppress(OSError):  # (an early answer is read all the same)
            sock.sendall(uri.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
        try:
            answer = _read_answer(sock, path, deadline)
        except TimeoutError:
            return _gave_up(path, seconds)
    if answer is None:
        return _own_cache(quiet, f"the image store at {path} closed without answering")
    kind, _, rest = answer.partition(" ")
    if kind == "ok":
        return entry(cfg, rest)
    if kind == "private":
        return _own_cache(quiet, f"the image store cannot pull {uri} without credentials")
    if kind == "busy":  # the caller's other requests hold every slot its user has
        return _own_cache(quiet, f"the image store: {rest}")
    if kind == "error":
        raise BerthError(f"the image store: {rest}")
    raise BerthError(f"the image store at {path} answered {answer[:100]!r}, "
                     "not ok, private, busy or error; refusing it")


def _gave_up(path, seconds):
    """The bound of a client's wait hit: a line even under --quiet (a log
    line for the site), then the caller's own import."""
    return _own_cache(False, f"the image store at {path} has not answered within {seconds} s "
                             "(BERTH_IMAGE_STORE_TIMEOUT)")


def _own_cache(quiet, why):
    if not quiet:
        print(f"berth: {why}; importing into your own cache", file=sys.stderr)
    return None


def _read_answer(sock, path, deadline):
    data = b""
    while b"\n" not in data:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > _ANSWER_MAX:
            raise BerthError(f"the image store at {path} answered more than "
                             f"{_ANSWER_MAX} bytes; refusing it")
    if not data:
        return None
    line, _, rest = data.partition(b"\n")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or rest or not text.isprintable():
        raise BerthError(f"the image store at {path} answered {data[:100]!r}, not one line; "
                         "refusing it")
    return text
