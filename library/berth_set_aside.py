#!/usr/bin/python
"""Ansible module: set a site's files aside with a manifest, and put them back byte for byte."""

DOCUMENTATION = r"""
---
module: berth_set_aside
short_description: Move or copy a site's files aside under a manifest, and restore them exactly
description:
  - With O(state=aside), each path of O(move) that exists is moved into the
    store beside O(manifest) (its bytes, mode, owner and extended attributes,
    file capabilities included), and each path of O(keep) is copied there
    and left in place, for a later task to change. A path of O(keep) that
    does not exist is recorded as absent, so that the way back removes what
    a later task puts there.
  - The manifest records, for every path, what was done, its SHA-256, mode
    and owner, or the target of a symbolic link. A path already in the
    manifest is never recorded again; the first record is the site's
    original, whatever ran since.
  - With O(state=restored), every recorded path gets its recorded bytes,
    mode and owner (or link) back, and a path recorded as absent is removed.
    Every stored copy is checked against its checksum before anything
    changes; one that differs fails the task naming it. The manifest and the
    store are removed last.
  - Each directory on a path, and the path itself, must belong to root or to
    the user the module runs as and be writable by no one else (a
    sticky root-owned directory such as C(/tmp) excepted); otherwise the task
    fails naming it, before any change.
version_added: "0.1.0"
options:
  state:
    description: V(aside) records and sets paths aside; V(restored) puts every recorded path back.
    type: str
    choices: [aside, restored]
    default: aside
  manifest:
    description: The manifest's path; its directory holds the store and is made 0700.
    type: path
    default: /var/lib/berth/adopt/manifest.json
  move:
    description: Absolute paths to move into the store (missing ones are skipped).
    type: list
    elements: path
    default: []
  keep:
    description: Absolute paths to copy into the store and leave in place, or to record as absent.
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Switch pyxis off, keeping its plugstack line, and note the files Berth will change
  berth_set_aside:
    move: [/etc/slurm/plugstack.conf.d/pyxis.conf]
    keep: [/etc/enroot/enroot.conf, /etc/slurm/plugstack.conf.d/berth.conf]

- name: Put everything back as it was
  berth_set_aside:
    state: restored
"""

RETURN = r"""
moved:
  description: Paths moved into the store (aside), or moved back (restored).
  returned: always
  type: list
  elements: str
  sample: [/etc/slurm/plugstack.conf.d/pyxis.conf]
kept:
  description:
    - Paths copied into the store or recorded as absent (aside), or
      rewritten from the store (restored).
  returned: always
  type: list
  elements: str
  sample: [/etc/enroot/enroot.conf]
removed:
  description: Paths recorded as absent and removed (restored).
  returned: always
  type: list
  elements: str
  sample: [/etc/slurm/plugstack.conf.d/berth.conf]
"""

import hashlib
import json
import os
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


class Refused(Exception):
    """A path or a stored copy the module will not act on; its text is the task's message."""


def sha256(path):
    digest = hashlib.sha256()
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_owned(path):
    """Refuse a path where another user could swap a file or a directory."""
    me = os.geteuid()
    parts = path.split("/")[1:]
    for depth in range(len(parts) + 1):
        here = "/" + "/".join(parts[:depth])
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return
        shared_sticky = st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, me) or (st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)
                                        and not shared_sticky):
            raise Refused(f"{here}: owned or writable by another user; nothing was set aside")
    if os.path.realpath(path) != path:
        check_owned(os.path.realpath(path))


def record_of(path, stored):
    """What the manifest keeps of a path: its kind, bytes' checksum, mode and owner."""
    st = os.lstat(path)
    entry = dict(path=path, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)
    if stat.S_ISLNK(st.st_mode):
        return dict(entry, link=os.readlink(path))
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{path}: neither a file nor a link; nothing was set aside")
    return dict(entry, sha256=sha256(path), stored=stored)


def copy_exactly(src, dest, entry):
    """src's bytes to dest (a new name in its directory), then the recorded
    owner, then mode and extended attributes: a chown clears capabilities."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".berth-aside.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp, follow_symlinks=False)
        os.chown(tmp, entry["uid"], entry["gid"])
        shutil.copystat(src, tmp, follow_symlinks=False)
        os.chmod(tmp, entry["mode"])
        os.rename(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def write_manifest(manifest, entries):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(manifest), prefix=".manifest.")
    with os.fdopen(fd, "w") as f:
        json.dump(dict(version=1, entries=entries), f, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, manifest)


def read_manifest(manifest):
    try:
        with open(manifest) as f:
            return json.load(f)["entries"]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as e:
        raise Refused(f"{manifest}: not a manifest this module wrote ({e})") from e


def plan_aside(params, recorded):
    """(action, path) for each path not yet in the manifest: moved, kept or absent."""
    plan = []
    for action, paths in (("moved", params["move"]), ("kept", params["keep"])):
        for path in paths:
            if not os.path.isabs(path):
                raise Refused(f"{path}: not an absolute path")
            check_owned(path)
            if path in recorded or path in (p for _, p in plan):
                continue
            if os.path.lexists(path):
                plan.append((action, path))
            elif action == "kept":
                plan.append(("absent", path))
    return plan


def set_aside(manifest, plan, entries):
    store = os.path.join(os.path.dirname(manifest), "files")
    os.makedirs(store, mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(manifest), 0o700)
    for action, path in plan:
        if action == "absent":
            entries.append(dict(path=path, action="absent"))
        else:
            stored = os.path.join(store, hashlib.sha256(path.encode()).hexdigest()[:16]
                                  + "-" + os.path.basename(path))
            entry = dict(record_of(path, stored), action=action)
            if "stored" in entry:
                copy_exactly(path, stored, entry)
                if sha256(stored) != entry["sha256"]:
                    raise Refused(f"{path}: changed while it was being set aside")
            entries.append(entry)
        write_manifest(manifest, entries)  # recorded before the original goes
        if action == "moved":
            os.unlink(path)


def check_store(entries):
    for entry in entries:
        if "stored" in entry and (not os.path.isfile(entry["stored"])
                                  or sha256(entry["stored"]) != entry["sha256"]):
            raise Refused(f"{entry['path']}: its copy {entry['stored']} is missing or changed;"
                          " nothing was restored")


# the result's list for each recorded action
RESULT_KEY = dict(moved="moved", kept="kept", absent="removed")


def restore_one(entry):
    """Put one recorded path back; its recorded action, or None if it already was as recorded."""
    path = entry["path"]
    if entry["action"] == "absent":
        if not os.path.lexists(path):
            return None
        os.unlink(path)
        return "absent"
    if "link" in entry:
        if os.path.islink(path) and os.readlink(path) == entry["link"]:
            return None
        tmp = os.path.join(os.path.dirname(path), ".berth-aside.link")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(entry["link"], tmp)
        os.lchown(tmp, entry["uid"], entry["gid"])
        os.rename(tmp, path)
    else:
        copy_exactly(entry["stored"], path, entry)
    return entry["action"]


def aside(module, manifest):
    entries = read_manifest(manifest)
    plan = plan_aside(module.params, {e["path"] for e in entries})
    result = dict(changed=bool(plan), moved=[p for a, p in plan if a == "moved"],
                  kept=[p for a, p in plan if a != "moved"], removed=[])
    if plan and not module.check_mode:
        os.makedirs(os.path.dirname(manifest), mode=0o700, exist_ok=True)
        set_aside(manifest, plan, entries)
    return result


def restored(module, manifest):
    entries = read_manifest(manifest)
    check_store(entries)
    for entry in entries:
        check_owned(entry["path"])
    result = dict(changed=bool(entries), moved=[], kept=[], removed=[])
    for entry in entries:
        action = entry["action"] if module.check_mode else restore_one(entry)
        if action:
            result[RESULT_KEY[action]].append(entry["path"])
    if entries and not module.check_mode:
        os.unlink(manifest)
        shutil.rmtree(os.path.join(os.path.dirname(manifest), "files"), ignore_errors=True)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["aside", "restored"], default="aside"),
            manifest=dict(type="path", default="/var/lib/berth/adopt/manifest.json"),
            move=dict(type="list", elements="path", default=[]),
            keep=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    manifest = module.params["manifest"]
    try:
        if not os.path.isabs(manifest):
            raise Refused(f"manifest '{manifest}' is not an absolute path")
        check_owned(os.path.dirname(manifest))
        act = aside if module.params["state"] == "aside" else restored
        module.exit_json(**act(module, manifest))
    except Refused as e:
        module.fail_json(msg=f"berth_set_aside: {e}")
    except OSError as e:
        module.fail_json(msg=f"berth_set_aside: {e.filename or manifest}: {e.strerror}")


if __name__ == "__main__":
    main()
