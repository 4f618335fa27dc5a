"""Node-local copies of the shared image store's entries (docs/architecture/store.md,
"Node-local copies"): the store's service, as the store's account, copies
an entry it hands out once into BERTH_IMAGE_STORE_LOCAL on this node and
answers the copy, which steps then mount instead of the shared file.

    LOCAL/<key>.sqsh          a whole copy of the store's images/<key>.sqsh
    LOCAL/<key>.sqsh.tmp-PID  a copy being written (or left by a killed one)
    LOCAL/locks/<key>         flock: one copy of a key at a time on this node

A copy is written under its temporary name, fsync'ed and renamed, so
<key>.sqsh is whole or absent. A copy never leaves less than
squash.free_floor() of LOCAL's filesystem free (a tenth, and at least
1 GiB), nor takes the copies together over BERTH_IMAGE_STORE_LOCAL_MAX_SIZE
where that is set: any user can ask the store for every entry it holds.
Copies of other entries, least recently used first and none being written,
make room for it; where that is not enough (or the entry alone is over the
cap) the step mounts the store's entry instead. sweep(), after each answer, removes the
copies whose entry left the store, the temporary files of killed copies and
the lock files of keys with no copy, each with the key's lock held.

The client's side (store.reused, store.entry) takes a copy only after
store.checked() has walked LOCAL from / without following a link.
"""

import contextlib
import fcntl
import os
import re
import stat
import sys
import time

from berth.errors import BerthError
from berth.image import squash
from berth.image.cachelayout import CacheLayout
from berth.image.cachescan import last_use
from berth.store.paths import local_limit, local_path, walk
from berth.units import human_size

_COPY_NAME = re.compile(r"([0-9a-f]{64})\.sqsh(\.tmp-.+)?")
_KEY = re.compile(r"[0-9a-f]{64}")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_CHUNK = 8 << 20


def _refuser(local):
    def refuse(why):
        return BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: {why}")
    return refuse


class _Local:
    """LOCAL and LOCAL/locks, open, as the store's account's own."""

    def __init__(self, local, make):
        self.path = local
        refuse = _refuser(local)
        self.fd = walk(local, os.geteuid(), refuse, make=make)
        self.locks = None
        try:
            if os.fstat(self.fd).st_uid != os.geteuid():
                raise refuse(f"owned by uid {os.fstat(self.fd).st_uid}, not by the store's "
                             f"account (uid {os.geteuid()})")
            with contextlib.suppress(FileExistsError):
                os.mkdir("locks", 0o700, dir_fd=self.fd)
            try:
                self.locks = os.open("locks", _DIR | os.O_NOFOLLOW, dir_fd=self.fd)
            except OSError as e:
                raise refuse(f"locks: {e.strerror}") from None
            st = os.fstat(self.locks)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise refuse(f"locks: not the store account's alone (owner uid {st.st_uid}, "
                             f"mode {stat.S_IMODE(st.st_mode):04o})")
        except BaseException:
            self.close()
            raise

    def close(self):
        for fd in (self.fd, self.locks):
            if fd is not None:
                os.close(fd)
        self.fd = self.locks = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def locked(self, key, wait):
        """Whether the key's lock is ours for the body (False: held elsewhere
        and not `wait`). The lock file is checked to be the one in locks/
        after the flock: sweep may remove it while holding it."""
        while True:
            fd = os.open(key, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600, dir_fd=self.locks)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise BerthError(f"{self.path}/locks/{key}: not a regular file")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    yield False
                    return
                try:
                    here = os.stat(key, dir_fd=self.locks, follow_symlinks=False).st_ino
                except FileNotFoundError:
                    here = None
                if here == os.fstat(fd).st_ino:
                    yield True
                    return
            finally:
                os.close(fd)

    def whole(self, name):
        """Whether LOCAL/name is a whole copy of ours (a regular file of the
        account, writable by nobody else, a whole squashfs)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                    and not st.st_mode & 0o022 and squash.looks_whole_fd(fd))
        finally:
            os.close(fd)

    def remove_partials(self, key):
        """The temporary files of `key`'s copies, with its lock held (no copy
        of it at work on this node); the names removed."""
        gone = []
        for name in os.listdir(self.fd):
            if name.startswith(f"{key}.sqsh.tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self.fd)
                    gone.append(name)
        return gone


def copied(cfg, image):
    """This node's copy of the store's entry `image` (images/<key>.sqsh),
    made when missing; `image` itself when BERTH_IMAGE_STORE_LOCAL is not
    set, or when the copy cannot be made (a full disk, say: said on stderr,
    the journal). A wrong BERTH_IMAGE_STORE_LOCAL is a BerthError."""
    local = local_path(cfg)
    if local is None:
        return image
    limit = local_limit(cfg)
    name = os.path.basename(image)
    key = CacheLayout.key_of(name)
    with _Local(local, make=True) as here:
        if here.whole(name):
            return os.path.join(local, name)
        with here.locked(key, wait=True):
            if here.whole(name):  # made while this one waited
                return os.path.join(local, name)
            here.remove_partials(key)
            try:
                short = _make_room(here, os.stat(image).st_size, key, limit)
                if short:
                    print(f"berth: not copying {image} to {local}: {short}; answering the "
                          "store's entry", file=sys.stderr)
                    return image
                _copy(image, here, name)
            except OSError as e:
                print(f"berth: cannot copy {image} to {local}: {e.strerror or e}; "
                      "answering the store's entry", file=sys.stderr)
                return image
    return os.path.join(local, name)


def _held(here):
    """The bytes LOCAL's copies and their temporary files take."""
    total = 0
    for name in os.listdir(here.fd):
        if _COPY_NAME.fullmatch(name):
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(name, dir_fd=here.fd, follow_symlinks=False).st_size
    return total


def _shortfall(here, need, limit):
    """Why a copy of `need` bytes does not fit now (the free-space floor it
    would leave LOCAL's filesystem under, or the cap it would take the copies
    over), or None when it fits."""
    st = os.fstatvfs(here.fd)
    floor = squash.free_floor(st)
    if st.f_bavail * st.f_frsize - need < floor:
        return f"it would leave less than {human_size(floor)} free there"
    if limit is not None and _held(here) + need > limit:
        return ("the copies would hold more than BERTH_IMAGE_STORE_LOCAL_MAX_SIZE "
                f"({human_size(limit)})")
    return None


def _make_room(here, need, key, limit):
    """None when a copy of `need` bytes fits, once the least recently used
    copies of other keys went for it (each with its lock held: none is
    being written); else why it does not. An entry over the cap by itself
    takes nothing from the others."""
    if limit is not None and need > limit:
        return f"it alone is larger than BERTH_IMAGE_STORE_LOCAL_MAX_SIZE ({human_size(limit)})"
    short = _shortfall(here, need, limit)
    if not short:
        return None
    copies = []
    for name in os.listdir(here.fd):
        match = _COPY_NAME.fullmatch(name)
        if match and not match[2] and match[1] != key:
            with contextlib.suppress(FileNotFoundError):
                copies.append((last_use(os.stat(name, dir_fd=here.fd, follow_symlinks=False)),
                               match[1]))
    for _, other in sorted(copies):
        with here.locked(other, wait=False) as held:
            if not held:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{other}.sqsh", dir_fd=here.fd)
                print(f"berth: removed {here.path}/{other}.sqsh (least recently used, "
                      "for a new copy)", file=sys.stderr)
        short = _shortfall(here, need, limit)
        if not short:
            return None
    return short


def _copy(image, here, name):
    """image to LOCAL/name: a temporary file, fsync'ed, renamed into place."""
    started = time.monotonic()
    temp = f"{name}.tmp-{os.getpid()}"
    source = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(source).st_size
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o644, dir_fd=here.fd)
        try:
            try:
                done = 0
                while chunk := os.read(source, _CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
                    done += len(chunk)
                if done != size:
                    raise OSError(0, f"read {done} bytes of {size}")
                os.fchmod(out, 0o644)
                os.fsync(out)
            finally:
                os.close(out)
            if not here.whole(temp):
                raise OSError(0, "the copy is not a whole squashfs")
            os.rename(temp, name, src_dir_fd=here.fd, dst_dir_fd=here.fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=here.fd)
            raise
        os.fsync(here.fd)
    finally:
        os.close(source)
    took = time.monotonic() - started
    print(f"berth: copied {image} to {here.path}/{name} ({size} bytes in {took:.1f} s)",
          file=sys.stderr)


def sweep(cfg, store):
    """After an answer: remove this node's copies whose entry left the
    store (pruned), the temporary files of killed copies and the lock files
    of keys with neither; each with the key's lock held, never waiting for
    it. A line each on stderr (the journal)."""
    local = local_path(cfg)
    if local is None or not os.path.isdir(local):
        return
    images = os.path.join(store, "images")
    with _Local(local, make=False) as here:
        keys = set()
        for name in os.listdir(here.fd):
            match = _COPY_NAME.fullmatch(name)
            if match:
                keys.add(match[1])
        for key in sorted(keys):
            with here.locked(key, wait=False) as held:
                if not held:
                    continue  # a copy of it is at work
                for name in here.remove_partials(key):
                    print(f"berth: removed {local}/{name} (left by a killed copy)",
                          file=sys.stderr)
                if _gone(os.path.join(images, f"{key}.sqsh")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{key}.sqsh", dir_fd=here.fd)
                        print(f"berth: removed {local}/{key}.sqsh (no longer in the store)",
                              file=sys.stderr)
        present = {m[1] for m in map(_COPY_NAME.fullmatch, os.listdir(here.fd)) if m}
        for key in os.listdir(here.locks):
            if _KEY.fullmatch(key) and key not in present:
                with here.locked(key, wait=False) as held:
                    if held and not any(n.startswith(f"{key}.sqsh")
                                        for n in os.listdir(here.fd)):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(key, dir_fd=here.locks)


def _gone(image):
    """Whether the store's entry `image` is gone (not merely unreadable now)."""
    try:
        os.stat(image, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False
