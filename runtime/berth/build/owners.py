"""COPY/ADD --chown=USER[:GROUP]: the owner BuildKit gives what a step
copies, and where a build keeps it.

A name is looked up in the stage's own /etc/passwd and /etc/group (read
with the root as `/`, as BuildKit reads them), a number is taken as it
is; without a group, a named user's primary group, else the uid. The
owners are not in the squashfs, which is all root's as every image Berth
runs (one uid is mapped): they go to the OCI layers (layers.py), each
path a step made keeping the owner it got until a later step replaces it.
The owners a stage's tree has after a step are kept beside that step's
layer record, so a step taken from the cache gives them too."""

import json
import os
import stat
import typing

from berth import rootpath
from berth.errors import BerthError
from berth.image.cachelayout import CacheLayout

_MAX_DB = 16 << 20  # (an /etc/passwd of a few KiB in practice; the image is hostile)


class Owner(typing.NamedTuple):
    uid: int
    gid: int


def flag(step, expand):
    """The --chown value of COPY/ADD `step`, its variables expanded, or None."""
    for value in step.flags:
        if value.startswith("--chown="):
            return expand(value[len("--chown="):])
    return None


def _database(root, name, where):
    """{name: fields} of the image's /etc/`name` (passwd or group)."""
    path = rootpath.resolve(root, f"/etc/{name}", follow_last=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise BerthError(f"{where}: the image's /etc/{name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise BerthError(f"{where}: the image's /etc/{name} is not a regular file")
        text = f.read(_MAX_DB + 1).decode(errors="replace")
    if len(text) > _MAX_DB:
        raise BerthError(f"{where}: the image's /etc/{name} is larger than 16 MiB")
    found = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] not in found:
            found[fields[0]] = fields
    return found


def _number(text):
    return int(text) if text.isdigit() and int(text) < 1 << 32 else None


def resolve(root, value, *, where, shown):
    """The Owner --chown=`value` names in the stage tree `root`; a name the
    image lacks is refused in one line."""
    user, _, group = value.partition(":")
    if not user:
        raise BerthError(f"{where}: {shown}: expected USER[:GROUP]")
    uid, primary = _number(user), None
    if uid is None:
        entry = _database(root, "passwd", where).get(user)
        if entry is None or _number(entry[2]) is None:
            raise BerthError(f"{where}: {shown}: no user '{user}' in the image's /etc/passwd")
        uid, primary = _number(entry[2]), _number(entry[3])
    if not group:
        return Owner(uid, primary if primary is not None else uid)
    gid = _number(group)
    if gid is None:
        entry = _database(root, "group", where).get(group)
        if entry is None or _number(entry[2]) is None:
            raise BerthError(f"{where}: {shown}: no group '{group}' in the image's /etc/group")
        gid = _number(entry[2])
    return Owner(uid, gid)


def _record(cfg, key):
    return CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_layer(key).removesuffix(".json") \
        + ".owners.json"


def keep(cfg, key, owners):
    """Record `owners` ({path in the root: Owner}) as the tree's after the step `key`."""
    if not owners:
        return
    where = _record(cfg, key)
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    partial = f"{where}.tmp-{os.getpid()}"
    with open(partial, "w", encoding="utf-8", errors="surrogateescape") as f:
        json.dump(owners, f, sort_keys=True)
    os.rename(partial, where)


def found(cfg, key):
    """The owners keep() recorded for the step `key` ({} where it kept none)."""
    try:
        with open(_record(cfg, key), encoding="utf-8", errors="surrogateescape") as f:
            return {path: Owner(*ids) for path, ids in json.load(f).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as e:
        raise BerthError(f"{_record(cfg, key)}: unreadable ({e}); build with --no-cache") \
            from None
