"""The shared image store (docs/architecture/store.md): one
image cache on a filesystem every node mounts, written only by the store's
account, read by every user.

Where it is and who owns it (BERTH_IMAGE_STORE, BERTH_IMAGE_STORE_LOCAL,
BERTH_IMAGE_STORE_OWNER), its entries (entry(), which accepts a path only
if it is an entry of the store, or this node's copy of one, owned by its
account and writable by nobody else, in directories nobody else may write:
checked()), the walk to them (walk(): safedir.open_no_links with the
store's checks), and an entry's line in `store list` and `store prune`.
Used by every side: client.py, service.py, local.py, prune.py, verbs.py.
"""

import contextlib
import errno
import os
import pwd
import stat
import time

from berth import safedir, units
from berth.errors import BerthError
from berth.image import squash
from berth.image.cachelayout import IMAGE_NAME
from berth.units import human_size


def path_of(cfg):
    """BERTH_IMAGE_STORE, or None when no store is configured."""
    store = cfg["BERTH_IMAGE_STORE"].strip()
    if not store:
        return None
    if not os.path.isabs(store):
        raise BerthError(f"BERTH_IMAGE_STORE={store}: not an absolute path")
    return store


def configured_path(cfg):
    """BERTH_IMAGE_STORE, for a verb that has nothing to do without one."""
    store = path_of(cfg)
    if store is None:
        raise BerthError("no image store here: BERTH_IMAGE_STORE is not set")
    return store


def owned_store(cfg, command):
    """BERTH_IMAGE_STORE, for `command` (which writes the store) run as the
    store's account: never as root, nor as any other uid."""
    if os.geteuid() == 0:
        raise BerthError(f"{command} refuses to run as root; run it as the store's "
                         f"account ({cfg['BERTH_IMAGE_STORE_OWNER']})")
    store = configured_path(cfg)
    uid = owner_uid(cfg)
    if os.geteuid() != uid:
        raise BerthError(f"{command} runs as uid {os.geteuid()}, not as "
                         f"BERTH_IMAGE_STORE_OWNER {cfg['BERTH_IMAGE_STORE_OWNER']} (uid {uid})")
    return store


def local_path(cfg):
    """BERTH_IMAGE_STORE_LOCAL, the node-local directory of copies of the
    store's entries, or None when not set."""
    local = cfg["BERTH_IMAGE_STORE_LOCAL"].strip()
    if not local:
        return None
    store = path_of(cfg)
    if store is None:
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: set without BERTH_IMAGE_STORE, "
                         "so there is nothing to copy")
    if not os.path.isabs(local):
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: not an absolute path")
    local = os.path.normpath(local)
    for inside in (store, os.path.realpath(store)):
        if os.path.commonpath([local, os.path.normpath(inside)]) == os.path.normpath(inside):
            raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: inside BERTH_IMAGE_STORE="
                             f"{store}; it must be a node-local directory")
    return local


def local_limit(cfg):
    """BERTH_IMAGE_STORE_LOCAL_MAX_SIZE in bytes, or None when not set."""
    text = cfg["BERTH_IMAGE_STORE_LOCAL_MAX_SIZE"].strip()
    if not text:
        return None
    if local_path(cfg) is None:
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL_MAX_SIZE={text}: set without "
                         "BERTH_IMAGE_STORE_LOCAL, so there are no copies to cap")
    limit = units.size(text)
    if limit is None:
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL_MAX_SIZE={text}: expected a size such as "
                         "200G (bytes, or K, M, G or T)")
    return limit


def owner_uid(cfg):
    """The uid of BERTH_IMAGE_STORE_OWNER (a user name, or a uid)."""
    owner = cfg["BERTH_IMAGE_STORE_OWNER"].strip()
    uid = units.whole(owner)
    if uid is not None and uid < 2 ** 32 - 1:  # (uid_t; -1 is none)
        return uid
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise BerthError(f"BERTH_IMAGE_STORE_OWNER={owner}: no such user here") from None


def entry(cfg, path):
    """`path` if it is a whole entry of the store (images/<key>.sqsh) or a
    node-local copy of one (BERTH_IMAGE_STORE_LOCAL/<key>.sqsh), as its
    resolved path: see checked()."""
    store = os.path.realpath(path_of(cfg))
    local = local_path(cfg)
    real = os.path.realpath(path)

    def refuse(why):
        return BerthError(f"the image store's answer {path}: {why}; refusing it")

    directory, name = os.path.split(real)
    if not os.path.isabs(path) or not IMAGE_NAME.fullmatch(name) \
            or directory not in (os.path.join(store, "images"), local):
        also = f" nor of BERTH_IMAGE_STORE_LOCAL={local}" if local else ""
        raise refuse(f"not an image of BERTH_IMAGE_STORE={path_of(cfg)}{also}")
    return checked(cfg, directory, name, refuse, strict_from=store)


def checked(cfg, directory, name, refuse, strict_from=None):
    """directory/name if it is a regular file of the store's account that
    nobody else may write and a whole squashfs, in `directory` reached from
    / without following a symbolic link, through directories owned by root
    or the account that nobody else may write (see walk); else refuse(why)
    is raised."""
    uid = owner_uid(cfg)
    dir_fd = walk(directory, uid, refuse, strict_from=strict_from)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except FileNotFoundError:
            raise refuse("no such file") from None
        except OSError as e:
            raise refuse("a symbolic link" if e.errno == errno.ELOOP else e.strerror) from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("not a regular file")
        if st.st_uid != uid:
            raise refuse(f"owned by uid {st.st_uid}, not by BERTH_IMAGE_STORE_OWNER "
                         f"{cfg['BERTH_IMAGE_STORE_OWNER']} (uid {uid})")
        if st.st_mode & 0o022:
            raise refuse(f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
        if not squash.looks_whole_fd(fd):
            raise refuse("not a whole squashfs")
    finally:
        os.close(fd)
    return os.path.join(directory, name)


def walk(directory, uid, refuse, make=False, strict_from=None):
    """The absolute `directory` open, reached from / without following a
    symbolic link (safedir.open_no_links): each directory on the way owned
    by root or `uid` and writable by nobody else (sticky ones such as /tmp
    aside: what is in them is checked next), `directory` itself and those
    from `strict_from` on not even sticky. With `make`, a missing last
    directory is made 0755. Else refuse(why)."""
    strict_from = os.path.join(strict_from, "") if strict_from else None

    def check(current, fd, last):
        strict = last or bool(strict_from) and os.path.join(current, "").startswith(strict_from)
        st = os.fstat(fd)
        writable = st.st_mode & 0o022 and (strict or not st.st_mode & stat.S_ISVTX)
        if st.st_uid not in (uid, 0) or writable:
            mode = f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
            raise refuse(f"{current} is not the store account's alone ({mode})" if strict
                         else f"{current} lets others replace what is in it ({mode})")

    try:
        return safedir.open_no_links(directory, check, make_mode=0o755 if make else None)
    except safedir.Unreachable as e:
        if e.link and e.error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refuse(f"{e.path} is a symbolic link (give the resolved path)") from None
        raise refuse(str(e)) from None


def entry_line(entry, what):
    """A line of `store list` and `store prune`: size, last use, `what`, path."""
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.used))
    return f"{human_size(entry.size):>8}  {used}  {what}  {entry.path}"


def source(image):
    """The URI an entry was imported from, as its image.json records it.
    Reading it is no use of the entry: the atime goes back where it was,
    when this process may set it (the store's account, root)."""
    try:
        before = os.stat(image, follow_symlinks=False)
    except OSError:
        before = None
    uri = squash.recorded(image, "source")
    if before is not None:
        with contextlib.suppress(OSError):
            after = os.stat(image, follow_symlinks=False)
            if after.st_atime_ns != before.st_atime_ns and after.st_mtime_ns == before.st_mtime_ns:
                os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns), follow_symlinks=False)
    return uri if uri and uri.isprintable() else "?"
