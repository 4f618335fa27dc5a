"""`berth setup-user USER`: make one user's runtime directories, as root.

The Slurm prolog (and the SPANK plugin) call this before a job so the user
finds ENROOT_CACHE_PATH, ENROOT_DATA_PATH, ENROOT_RUNTIME_PATH and
ENROOT_CONFIG_PATH ready, 0700 and their own, under shared roots the
deployment made root-owned 0755 (a user cannot mkdir there). Every path is
checked before any is made, so a bad one leaves nothing half done. Paths in a
home directory that does not exist are skipped: a prolog that fails drains the
node, and one user's missing home must not do that.
"""

import json
import os
import pwd
import stat

from berth import config
from berth.errors import BerthError

USER_KEYS = ("ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_RUNTIME_PATH", "ENROOT_CONFIG_PATH")


def cmd_setup_user(args, cfg):
    if os.geteuid() != 0:
        raise BerthError("setup-user must run as root")
    user = _lookup(args.user)
    plan = [step for key, path in user_paths(user).items() if (step := _plan(key, path, user))]
    for key, path, as_user in plan:
        try:
            _make(path, user, as_user)
        except OSError as e:
            raise BerthError(f"{key}={path}: {e.strerror}") from None
    return 0


def user_paths(user):
    """The four per-user paths as the runtime computes them when `user` runs it.

    Computed in a child that has become the user, so ${UID}, ${USER} and the
    XDG defaults resolve exactly as in the user's own `berth` process.
    """
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "XDG_RUNTIME_DIR": f"/run/user/{user.pw_uid}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if os.environ.get("ENROOT_SYSCONF_PATH"):
        env["ENROOT_SYSCONF_PATH"] = os.environ["ENROOT_SYSCONF_PATH"]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.initgroups(user.pw_name, user.pw_gid)
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            cfg = config.load(env)
            reply = {"paths": {key: cfg[key] for key in USER_KEYS}}
        except Exception as e:  # any failure goes back to the parent as one line
            reply = {"error": str(e)}
        with os.fdopen(write_end, "w") as f:
            json.dump(reply, f)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    os.waitpid(pid, 0)
    reply = json.loads(text) if text else {"error": f"reading the configuration as {user.pw_name} failed"}
    if "error" in reply:
        raise BerthError(reply["error"])
    return reply["paths"]


def _lookup(name):
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise BerthError(f"setup-user: no such user '{name}'") from None


def _plan(key, path, user):
    """Check one path; return (key, path, make it as the user) or None when there is nothing to do."""
    if not os.path.isabs(path):
        raise BerthError(f"{key}={path}: not an absolute path")
    path = os.path.normpath(path)
    home = os.path.normpath(user.pw_dir)
    if os.path.commonpath([path, home]) == home and not os.path.isdir(home):
        return None
    if os.path.lexists(path):
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise BerthError(f"{key}={path}: exists and is not a directory")
        if st.st_uid != user.pw_uid:
            raise BerthError(
                f"{key}={path}: owned by uid {st.st_uid}, not {user.pw_name}; "
                "a per-user path needs ${UID} or ${USER} in it")
        return None
    parent = os.path.dirname(path)
    ancestor = parent
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if os.stat(ancestor).st_uid == user.pw_uid:
        return key, path, True
    if ancestor != parent:
        raise BerthError(f"{key}={path}: parent {parent} does not exist")
    return key, path, False


def _make(path, user, as_user):
    if as_user:
        # Inside the user's own tree (their home, maybe on root-squashed NFS):
        # create as the user, so ownership is right and root needs no access.
        os.setegid(user.pw_gid)
        os.seteuid(user.pw_uid)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        finally:
            os.seteuid(0)
            os.setegid(0)
        return
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # made by a concurrent prolog, or an earlier key with the same path
    os.chown(path, user.pw_uid, user.pw_gid)
