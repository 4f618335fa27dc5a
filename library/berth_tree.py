#!/usr/bin/python
"""Ansible module: make a directory on the node hold exactly the given text files."""

DOCUMENTATION = r"""
---
module: berth_tree
short_description: Make a directory hold exactly the given text files, in one module run
description:
  - Writes each file of O(files) under O(dest) whose content differs, creating
    directories as needed, and removes every other file, link and directory
    below O(dest); a file deleted from the source does not live on.
  - One module run per host instead of one per file; the files travel in the
    module's arguments, typically read on the controller with
    C(query('ansible.builtin.file', ..., rstrip=false)). For source trees of
    text files (the runtime's Python, the plugin's C), a few hundred kilobytes.
  - Files are written to a temporary name and renamed into place.
    Directories are made O(dir_mode) and files O(mode), owned by the user the
    module runs as.
  - With C(--diff), the old and new text of each file written, as the
    template module shows it (files over 64 KiB by name only).
  - O(dest) and everything below it belong to this module; a symbolic link in
    the tree is removed, never followed.
version_added: "0.1.0"
options:
  dest:
    description: Absolute path of the directory to manage; made if missing.
    type: path
    required: true
  files:
    description:
      - Relative path (no C(..), no leading C(/)) to UTF-8 text content.
    type: dict
    required: true
  mode:
    description: Mode of every file.
    type: raw
    default: "0644"
  dir_mode:
    description:
      - Mode of O(dest), set whenever it differs, and of the directories
        made below it. Without it, directories are made 0755 and the mode of
        an existing O(dest) is left alone.
    type: raw
  purge:
    description:
      - Remove what O(files) does not name. With V(false), only the named
        paths are managed (a link or directory in a named file's place is
        still replaced, never followed); for a directory shared with
        files that others install, such as C(hooks.d) or
        C(/etc/systemd/system). Such a O(dest) may itself be a link to a
        directory, which is followed, as M(ansible.builtin.file) does.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Copy the plugin's sources in one go
  berth_tree:
    dest: /usr/local/src/spank_berth
    files: "{{ dict(names | zip(query('ansible.builtin.file', *paths, rstrip=false))) }}"

- name: Add two hooks beside the site's own
  berth_tree:
    dest: /etc/enroot/hooks.d
    files:
      10-home.sh: "{{ lookup('ansible.builtin.file', 'hooks/10-home.sh', rstrip=false) }}"
      98-nvidia.sh: "{{ lookup('ansible.builtin.file', 'hooks/98-nvidia.sh', rstrip=false) }}"
    mode: "0755"
    purge: false

- name: A user's private configuration directory and one file in it, as the user
  berth_tree:
    dest: /home/alice/.config/enroot
    files:
      .credentials: "machine registry.example.org login alice password secret\n"
    mode: "0600"
    dir_mode: "0700"
    purge: false
  become: true
  become_user: alice
"""

RETURN = r"""
written:
  description: Files written (new or changed), relative to O(dest).
  returned: always
  type: list
  elements: str
  sample: [berth/cli.py]
removed:
  description: Paths removed below O(dest) because O(files) does not name them.
  returned: always
  type: list
  elements: str
  sample: [berth/old.py]
"""

import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


def bad_path(rel):
    parts = rel.split("/")
    return not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts)


def present(dest):
    """{relative path: lstat} of everything below dest, not following links."""
    found = {}
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, dest)] = os.lstat(path)
    return found


def differs(path, content):
    try:
        with open(path, "rb") as f:
            return f.read() != content
    except OSError:
        return True


def write(module, path, content, mode):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".berth-tree.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, mode)
        move_into_place(module, tmp, path, mode)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def move_into_place(module, tmp, path, mode):
    """Rename tmp to path: owned by the module's user, never wider than mode."""
    # keep_dest_attrs=False: by default atomic_move copies an existing file's
    # owner and mode onto the new one, so the file would stay the old
    # owner's, with the old (maybe wider) mode until the chmod below. A file
    # it creates it makes 0666 & ~umask after the rename: the narrowed umask
    # keeps that within mode (a 0600 file is never readable by others).
    umask = os.umask(0o777 & ~mode)
    try:
        module.atomic_move(tmp, path, keep_dest_attrs=False)
    finally:
        os.umask(umask)
    os.chmod(path, mode)


def remove(path, st):
    if stat.S_ISDIR(st.st_mode):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            remove(child, os.lstat(child))
        os.rmdir(path)
    else:
        os.unlink(path)


DIFF_LIMIT = 64 * 1024


def octal(module, name):
    value = module.params[name]
    try:
        return None if value is None else int(str(value), 8)
    except ValueError:
        module.fail_json(msg=f"berth_tree: {name} '{value}' is not octal")


def text_of(path):
    try:
        with open(path, "rb") as f:
            return f.read(DIFF_LIMIT + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def file_diffs(dest, found, written, removed, files):
    """What --diff shows: each written file's old and new text, as template does."""
    diffs = []
    for rel in written:
        path = os.path.join(dest, rel)
        existed = rel in found and stat.S_ISREG(found[rel].st_mode)
        if len(files[rel]) > DIFF_LIMIT or existed and found[rel].st_size > DIFF_LIMIT:
            diffs.append(dict(before_header=path, after_header=path,
                              before=f"({'a file' if existed else 'absent'})\n",
                              after="(over 64 KiB: not shown)\n"))
            continue
        diffs.append(dict(before_header=path, after_header=path,
                          before=text_of(path) if existed else "",
                          after=files[rel].decode("utf-8")))
    for rel in removed:
        path = os.path.join(dest, rel)
        diffs.append(dict(before_header=path, after_header=path,
                          before=f"{rel}\n", after=""))
    return diffs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            files=dict(type="dict", required=True),
            mode=dict(type="raw", default="0644"),
            dir_mode=dict(type="raw"),
            purge=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    if not os.path.isabs(dest):
        module.fail_json(msg=f"berth_tree: dest '{dest}' is not an absolute path")
    mode = octal(module, "mode")
    dir_mode = octal(module, "dir_mode")
    files = {}
    for rel, text in module.params["files"].items():
        if bad_path(rel):
            module.fail_json(msg=f"berth_tree: files: '{rel}' is not a relative path below dest")
        if not isinstance(text, str):
            module.fail_json(msg=f"berth_tree: files: '{rel}' is not text")
        files[rel] = text.encode("utf-8")
    wanted_dirs = {os.path.dirname(rel) for rel in files} - {""}
    for d in list(wanted_dirs):
        while os.path.dirname(d):
            d = os.path.dirname(d)
            wanted_dirs.add(d)

    purge = module.params["purge"]
    # a tree of our own is never reached through a link; a shared directory
    # (purge false) may be one, as the file module follows it
    dest_is_dir = os.path.isdir(dest) and not (purge and os.path.islink(dest))
    found = present(dest) if dest_is_dir else {}
    if not purge:
        found = {rel: st for rel, st in found.items() if rel in files or rel in wanted_dirs}
    removed = sorted(
        rel for rel, st in found.items()
        if not (rel in files and stat.S_ISREG(st.st_mode))
        and not (rel in wanted_dirs and stat.S_ISDIR(st.st_mode))
    )
    # what a removed directory held goes with it
    removed = [rel for rel in removed
               if not any(rel.startswith(parent + "/") for parent in removed)]
    written = sorted(rel for rel, content in files.items()
                     if rel in removed or rel not in found
                     or stat.S_IMODE(found[rel].st_mode) != mode
                     or differs(os.path.join(dest, rel), content))
    dest_mode_wrong = (dir_mode is not None and dest_is_dir
                       and stat.S_IMODE(os.stat(dest).st_mode) != dir_mode)
    changed = bool(written or removed) or not dest_is_dir or dest_mode_wrong
    result = dict(changed=changed, written=written, removed=removed,
                  diff=file_diffs(dest, found, written, removed, files))
    if module.check_mode or not changed:
        module.exit_json(**result)
    made_mode = 0o755 if dir_mode is None else dir_mode
    try:
        if not dest_is_dir and os.path.islink(dest):
            os.unlink(dest)
        if not dest_is_dir:
            # Missing parents 0755 whatever the umask: as a user on Debian 13
            # it is 002, and a group-writable ~/.config is refused by berth.
            os.umask(0o022)
            os.makedirs(dest, mode=made_mode)
            os.chmod(dest, made_mode)  # makedirs' mode passes through the umask
        elif dest_mode_wrong:
            os.chmod(dest, dir_mode)
        for rel in removed:
            path = os.path.join(dest, rel)
            if os.path.lexists(path):
                remove(path, os.lstat(path))
        for d in sorted(wanted_dirs):
            path = os.path.join(dest, d)
            if not os.path.isdir(path):
                os.mkdir(path, made_mode)
        for rel in written:
            write(module, os.path.join(dest, rel), files[rel], mode)
    except OSError as e:
        module.fail_json(msg=f"berth_tree: {e.filename or dest}: {e.strerror}", **result)
    except Exception as e:  # atomic_move's own, naming the file it could not replace
        module.fail_json(msg=f"berth_tree: {e}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
