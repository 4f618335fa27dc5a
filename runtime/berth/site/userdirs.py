"""`berth setup-user USER`: make one user's runtime directories, as root.

The Slurm prolog (and the SPANK plugin) call this before a job, and on
login nodes a PAM session hook when a session opens, so the user
finds ENROOT_CACHE_PATH, ENROOT_DATA_PATH, ENROOT_RUNTIME_PATH and
ENROOT_CONFIG_PATH ready, 0700 and their own, under shared roots the
deployment made root-owned 0755 (a user cannot mkdir there). Every path is
checked before any is made, so a bad one leaves nothing half done.

Root never works in a tree the user controls (issue #11). The paths are
computed, checked and, where the user may write, made in a child that
became the user entirely (groups, gid, uid): there the kernel's own checks
keep a symbolic link in the user's tree from reaching anyone else's files.
Root makes only a directory whose parent is root's: reached from / through
root's directories and root's symbolic links, made with mkdirat in it, then
opened without following a link and chowned through that descriptor.

A prolog that fails drains the node, so what a user (or another user) did
to their own paths (a dangling link, a file, someone else's directory, a
missing home) is one warning line and exit 0; the user's own `berth` then
says what is wrong. So is the child that works as the user dying or
stopping: it is the user's process, which the user may signal (a loop of
`pkill -u $USER` while jobs start); root waits for it at most
USER_PART_SECONDS, then kills it. A bad admin setting (a relative path, a
missing shared parent, a shared path without ${UID} or ${USER}) stays an
error.
"""

import collections
import json
import os
import pwd
import select
import signal
import stat
import sys
import time

from berth import config, units
from berth.errors import BerthError

USER_KEYS = ("ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_RUNTIME_PATH", "ENROOT_CONFIG_PATH")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_LINKS = 40
# How long root waits for the child working as the user (a few mkdirs in
# the user's home; a slow NFS home takes seconds)
USER_PART_SECONDS = 30


class _UserPartLost(Exception):
    """The child working as the user ended without answering, or did not
    answer in time: her doing, never the admin's (a warning, exit 0)."""


# `berth setup-user USER` (cli.py makes it of the command line)
SetupUserRequest = collections.namedtuple("SetupUserRequest", "user")


def cmd_setup_user(request, cfg):
    if os.geteuid() != 0:
        raise BerthError("setup-user must run as root")
    user = _lookup(request.user)
    try:
        warnings = _setup(user)
    except _UserPartLost as e:
        warnings = [f"{e}; the user's directories may be missing (the job's own berth says which)"]
    for warning in warnings:
        print(f"berth: warning: setup-user {user.pw_name}: {warning}", file=sys.stderr)
    return 0


def _setup(user):
    """Plan, check and make the user's directories; the warnings."""
    env = _user_env(user)
    reply = _as_user(user, lambda: _plan_all(env, user))
    steps = reply["steps"]
    for step in steps:
        if step["action"] == "error":
            raise BerthError(f"{step['key']}={step['path']}: {step['message']}")
    warnings, parents = [], {}
    try:
        # Root's paths: their parents opened now, before anything is made.
        for step in steps:
            if step["action"] != "root":
                continue
            try:
                parents[step["path"]] = _open_roots(os.path.dirname(step["path"]))
            except _Missing as e:
                raise BerthError(f"{step['key']}={step['path']}: parent {e} does not exist") \
                    from None
            except _Unsafe as e:
                step["action"], step["message"] = "warn", f"not made: {e}"
        mine = [step for step in steps if step["action"] == "user"]
        if mine:
            warnings += _as_user(user, lambda: _make_as_user(mine, user))["warnings"]
        for step in steps:
            if step["action"] == "root":
                problem = _make_as_root(parents[step["path"]], step["path"], user)
                if problem:
                    warnings.append(f"{step['key']}={step['path']}: {problem}")
            elif step["action"] == "warn":
                warnings.append(f"{step['key']}={step['path']}: {step['message']}")
    finally:
        for fd in parents.values():
            os.close(fd)
    return warnings


def _user_env(user):
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "XDG_RUNTIME_DIR": f"/run/user/{user.pw_uid}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if os.environ.get("ENROOT_SYSCONF_PATH"):
        env["ENROOT_SYSCONF_PATH"] = os.environ["ENROOT_SYSCONF_PATH"]
    return env


def _as_user(user, work):
    """work() in a child that became `user` for good: their groups, gid and
    uid, real, effective and saved. Its JSON result, or its failure raised;
    _UserPartLost when it ends without an answer or gives none within
    USER_PART_SECONDS (it is killed then)."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            try:
                os.initgroups(user.pw_name, user.pw_gid)
                os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
                os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
                reply = {"result": work()}
            except Exception as e:  # any failure goes back to the parent as one line
                reply = {"error": str(e)}
            with os.fdopen(write_end, "w") as f:
                json.dump(reply, f)
        finally:
            os._exit(0)
    os.close(write_end)
    text = None
    try:
        text = _read_until(read_end, time.monotonic() + USER_PART_SECONDS)
    finally:
        os.close(read_end)
        if text is None:  # our own child, not reaped yet: its pid is not reused
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if text is None:
        raise _UserPartLost(f"the process working as {user.pw_name} gave no answer in "
                            f"{USER_PART_SECONDS} s; killed it")
    if not text:
        ended = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                 else f"exited with status {os.waitstatus_to_exitcode(status)}")
        raise _UserPartLost(f"the process working as {user.pw_name} {ended}")
    try:
        reply = json.loads(text)
    except ValueError:  # cut short by a signal while it wrote
        raise _UserPartLost(f"the process working as {user.pw_name} gave a broken answer") \
            from None
    if "error" in reply:
        raise BerthError(reply["error"])
    return reply["result"]


def _read_until(fd, deadline):
    """The bytes read from `fd` until its end, or None once `deadline` passes."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _lookup(name):
    try:
        uid = units.whole(name)
        return pwd.getpwnam(name) if uid is None else pwd.getpwuid(uid)
    except KeyError:
        raise BerthError(f"setup-user: no such user '{name}'") from None


# -- as the user: what each path needs ---------------------------------------

def _plan_all(env, user):
    cfg = config.load(env)
    return {"steps": [_plan(key, cfg[key], user) for key in USER_KEYS]}


def _plan(key, path, user):
    """One path, checked as the user: action ok, skip, user (the user makes
    it), root (root makes it in its root-owned parent), warn or error."""
    def step(action, message=""):
        return {"key": key, "path": path, "action": action, "message": message}

    if not os.path.isabs(path):
        return step("error", "not an absolute path")
    path = os.path.normpath(path)
    home = os.path.normpath(user.pw_dir)
    in_home = os.path.commonpath([path, home]) == home

    def problem(owner, message):
        # The admin's own paths are wrong: an error. Anything a user made: a warning.
        return step("error" if owner == 0 and not in_home else "warn", message)

    if in_home and not os.path.isdir(home):
        return step("skip")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a file, a loop or a closed directory on the way
        return problem(_owner_on_the_way(path), e.strerror)
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.stat(path)
            except OSError:
                return problem(st.st_uid, "a dangling symbolic link")
            if stat.S_ISDIR(target.st_mode) and target.st_uid == user.pw_uid:
                return step("ok")  # a link to a directory of their own: theirs to make
            return problem(st.st_uid, f"a symbolic link to {os.path.realpath(path)}, "
                                      f"not a directory of {user.pw_name}")
        if not stat.S_ISDIR(st.st_mode):
            return problem(st.st_uid, "exists and is not a directory")
        if st.st_uid != user.pw_uid:
            hint = "; a per-user path needs ${UID} or ${USER} in it" \
                if st.st_uid == 0 and not in_home else ""
            return problem(st.st_uid, f"owned by uid {st.st_uid}, not {user.pw_name}{hint}")
        return step("ok")
    parent = os.path.dirname(path)
    ancestor = parent
    while True:
        try:
            found = os.stat(ancestor)
            break
        except FileNotFoundError:
            ancestor = os.path.dirname(ancestor)
        except OSError as e:
            return problem(_owner_on_the_way(ancestor), f"{ancestor}: {e.strerror}")
    if not stat.S_ISDIR(found.st_mode):
        return problem(found.st_uid, f"{ancestor} is not a directory")
    if os.access(ancestor, os.W_OK | os.X_OK):
        return step("user")
    if found.st_uid != 0:
        return problem(found.st_uid, f"{ancestor} is owned by uid {found.st_uid}, "
                                     f"not {user.pw_name}")
    if ancestor != parent:
        return problem(0, f"parent {parent} does not exist")
    return step("root")


def _owner_on_the_way(path):
    """The owner of the deepest part of `path` that is there: whom to blame."""
    while True:
        try:
            return os.lstat(path).st_uid
        except OSError:
            if path == os.path.dirname(path):
                return 0
            path = os.path.dirname(path)


def _make_as_user(steps, user):
    warnings = []
    for step in steps:
        path = os.path.normpath(step["path"])
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
        except OSError as e:
            warnings.append(f"{step['key']}={step['path']}: {e.strerror}; not made")
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != user.pw_uid:
            warnings.append(f"{step['key']}={step['path']}: not a directory of "
                            f"{user.pw_name}; left as it is")
    return {"warnings": warnings}


# -- as root: a directory in a root-owned parent ------------------------------

class _Missing(Exception):
    pass


class _Unsafe(Exception):
    pass


def _trusted(st):
    """A directory only root can change entries of: root's, and writable by
    no one else (or sticky, so no one else may rename root's entries)."""
    return st.st_uid == 0 and (not st.st_mode & 0o022 or st.st_mode & stat.S_ISVTX)


def _open_roots(path):
    """A descriptor of directory `path`, reached from / through root's
    directories only (see _trusted), following only root's own symbolic
    links in them: no user can redirect what root opens."""
    fd, here = os.open("/", _DIR), "/"
    todo = [name for name in path.split("/") if name]
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            where = os.path.normpath(os.path.join(here, name))
            try:
                new = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                raise _Missing(where) from None
            except OSError as e:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    raise _Unsafe(f"{where}: {e.strerror}") from None
                if not stat.S_ISLNK(st.st_mode):
                    raise _Unsafe(f"{where} is not a directory") from None
                if st.st_uid != 0 or not _trusted(os.fstat(fd)):
                    raise _Unsafe(f"{where} is a symbolic link of uid {st.st_uid}; root "
                                  "follows only root's own") from None
                links += 1
                if links > _MAX_LINKS:
                    raise _Unsafe(f"{where}: too many levels of symbolic links") from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd, here = os.open("/", _DIR), "/"
                todo[:0] = [part for part in target.split("/") if part]
                continue
            st = os.fstat(new)
            if not _trusted(st):
                os.close(new)
                raise _Unsafe(f"{where} is owned by uid {st.st_uid} or writable by others; "
                              "root makes directories only in its own")
            os.close(fd)
            fd, here = new, where
        fd, opened = None, fd
        return opened
    finally:
        if fd is not None:
            os.close(fd)


def _make_as_root(parent_fd, path, user):
    """mkdirat in the root-owned parent, then open what was made without
    following a link and chown it through that descriptor; a problem found
    is returned as one line, never raised."""
    name = os.path.basename(path)
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        made = True
    except FileExistsError:  # a concurrent prolog, or an earlier key with the same path
        made = False
    except OSError as e:
        return f"{e.strerror}; not made"
    try:
        fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as e:
        return f"{e.strerror} (replaced by a link or a file?); left as it is"
    try:
        st = os.fstat(fd)
        if made and st.st_uid == 0:
            os.fchown(fd, user.pw_uid, user.pw_gid)
            os.fchmod(fd, 0o700)
        elif st.st_uid != user.pw_uid:
            return f"owned by uid {st.st_uid}, not {user.pw_name}; left as it is"
    finally:
        os.close(fd)
    return None
