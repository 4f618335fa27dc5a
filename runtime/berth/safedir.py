"""The caller's own directories (runtime, data, cache, config) are checked
before berth trusts what is in them.

A directory berth keeps the caller's files in must be owned by the caller
and writable by nobody else (the XDG rule), and its parent must not let
anyone else rename or replace it (owned by the caller or root, and not
writable by others unless sticky, like /tmp). Group write is no one else's
when the group is the caller's private group: Debian 13 gives login
sessions umask 002 (pam_umask, USERGROUPS_ENAB) exactly when the user's
primary group has the user's name and number, so a user's own `mkdir
~/.config` is 0775 there. Such a group is accepted if it lists no other
member; any other group-writable directory is refused. What berth creates it creates
0700 with mkdir, which never follows or reuses a symlink, then lstat checks
what is there: a directory another user made first, or a planted symlink,
is refused in one line naming it, never used. A symlink is followed only
when the caller or root owns it (then it is theirs, not a plant).

Each check is one lstat of the directory and one stat of its parent:
`berth start` pays for two or three directories.

A directory berth must reach without following any symbolic link (root
pruning a user's cache, the image store's entries) is opened from / one
name at a time by open_no_links(), the one such walk: each caller checks
what it finds on the way and words the refusal its own way.
"""

import grp
import os
import pwd
import stat

from berth.errors import BerthError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Unreachable(BerthError):
    """A directory on open_no_links's way that could not be made or opened:
    `path` (from / to it), the OSError, and whether it is a symbolic link."""

    def __init__(self, path, error, link=False, making=False):
        super().__init__(f"cannot create {path}: {error.strerror}" if making
                         else f"{path}: {error.strerror}")
        self.path, self.error, self.link = path, error, link


#: Why a directory of these keys is the caller's alone, where a site may
#: mean to share it (pyxis's setup guide's `group-$(id -g)` cache): what is
#: cached is trusted once found (an image by a key any user can compute, a
#: layer verified when written, not when read), so a member of the group
#: could plant what the others then run.
_NOT_SHARED = {
    "ENROOT_CACHE_PATH": "; a cache shared with other users (a group's) is refused: any of "
                         "them could plant an image or layer that the others would run "
                         "(give each user one, with $(id -u), or share images through "
                         "BERTH_IMAGE_STORE)",
}


def _refuse(path, what, why):
    rule = "(it must be owned by you and writable by nobody else)"
    raise BerthError(f"{what} {path}: {why}; refusing to use it {rule}"
                     + _NOT_SHARED.get(what, ""))


def _others_may_write(st):
    """Whether users other than the caller may write in a directory of mode
    st: world write, or group write by a group that is not the caller's own
    private group (same name and number as the caller, no other member)."""
    if st.st_mode & 0o002:
        return True
    if not st.st_mode & 0o020:
        return False
    uid = os.getuid()
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(st.st_gid)
    except KeyError:
        return True
    return not (st.st_gid == uid == user.pw_gid and group.gr_name == user.pw_name
                and set(group.gr_mem) <= {user.pw_name})


def check(path, what, st=None):
    """Refuse `path` unless it is a directory safe for the caller's files."""
    uid = os.getuid()
    try:
        st = st or os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                _refuse(path, what, f"is a symlink owned by uid {st.st_uid}")
            st = os.stat(path)
    except FileNotFoundError:
        _refuse(path, what, "is a dangling symlink")
    except OSError as e:
        raise BerthError(f"{what} {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        _refuse(path, what, "is not a directory")
    if st.st_uid != uid:
        _refuse(path, what, f"is owned by uid {st.st_uid}, not by you (uid {uid})")
    if _others_may_write(st):
        _refuse(path, what, f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
    _check_parent(path, what)
    return path


def _check_parent(path, what):
    parent = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (os.getuid(), 0):
                raise BerthError(f"{what} {path}: its parent {parent} is a symlink owned by "
                                 f"uid {st.st_uid}; refusing to use it")
            st = os.stat(parent)
    except OSError as e:
        raise BerthError(f"{what} {path}: {parent}: {e.strerror}") from None
    if st.st_uid not in (os.getuid(), 0) or (_others_may_write(st)
                                             and not st.st_mode & stat.S_ISVTX):
        raise BerthError(f"{what} {path}: its parent {parent} lets others replace it "
                         f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); "
                         "refusing to use it")


def ensure(path, what):
    """`path` checked, made 0700 first (with missing parents) when missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if parent != path and not os.path.lexists(parent):
            ensure(parent, what)
        _check_parent(path, what)  # before anything is made in there
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made meanwhile, by a concurrent start or by someone else: checked below
        except OSError as e:
            raise BerthError(f"{what} {path}: cannot create: {e.strerror}") from None
        st = None
    except PermissionError:
        _check_parent(path, what)  # names the culprit where it is another user's
        raise BerthError(f"{what} {path}: permission denied") from None
    except OSError as e:
        raise BerthError(f"{what} {path}: {e.strerror}") from None
    return check(path, what, st)


def check_if_present(path, what):
    """Like check, for a directory berth only reads: a missing one is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except PermissionError:
        _check_parent(path, what)
        raise BerthError(f"{what} {path}: permission denied") from None
    except OSError as e:
        raise BerthError(f"{what} {path}: {e.strerror}") from None
    return check(path, what, st)


def open_no_links(path, check=None, make_mode=None):
    """The absolute directory `path` open, reached from / one name at a time
    without following a symbolic link, so that no link (a user's) can lead
    the caller into another tree. check(current, fd, last) is called on each
    directory on the way once it is open, and may refuse it by raising. With
    make_mode, a missing last directory is made first, with that mode. What
    cannot be made or opened is raised as Unreachable."""
    fd, current = os.open("/", _DIR), "/"
    try:
        names = [name for name in path.split("/") if name]
        for i, name in enumerate(names):
            last = i == len(names) - 1
            current = os.path.join(current, name)
            if last and make_mode is not None:
                _make(name, fd, current, make_mode)
            try:
                new = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise Unreachable(current, e, link=is_link(name, fd)) from None
            os.close(fd)
            fd = new
            if check is not None:
                check(current, fd, last)
        fd, opened = None, fd
        return opened
    finally:
        if fd is not None:
            os.close(fd)


def _make(name, dir_fd, path, mode):
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as e:
        raise Unreachable(path, e, making=True) from None


def is_link(name, dir_fd):
    """Whether `name` in the directory open as dir_fd is a symbolic link."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
