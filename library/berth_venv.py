#!/usr/bin/python
"""Ansible module: install the berth runtime from source into its own venv."""

DOCUMENTATION = r"""
---
module: berth_venv
short_description: Install the berth runtime from a source tree into a dedicated virtual environment
description:
  - Creates O(venv) from O(python) with C(--system-site-packages), so the runtime's
    dependencies come from distribution packages, then installs the package in O(src)
    with C(pip --no-deps --no-index --no-build-isolation) (offline, nothing fetched).
  - Idempotent by content. The source tree is hashed (relative paths and file contents,
    sorted; C(__pycache__) and C(*.pyc) skipped) and the hash kept in
    C(<venv>/.source-sha256). When it matches, nothing is done.
  - The build runs in a temporary copy, so O(src) is never written to.
  - In check mode a missing O(src) (a copy task before this one did not run) reports a change.
version_added: "0.1.0"
options:
  src:
    description: Directory holding the runtime's C(pyproject.toml), on the managed node.
    type: path
    required: true
  venv:
    description: The virtual environment to create or update.
    type: path
    default: /opt/berth
  python:
    description: Interpreter the venv is made from; it must have requests and tqdm installed.
    type: path
    default: /usr/bin/python3
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
requirements:
  - python3 venv module, setuptools and wheel on O(python)
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Install the runtime
  berth_venv:
    src: /opt/berth/src
    venv: /opt/berth
"""

RETURN = r"""
sha256:
  description: Hash of the source tree now installed (or to be installed, in check mode).
  returned: always
  type: str
  sample: 3f1c0a...
previous_sha256:
  description: Hash recorded before this run; empty when the runtime was not installed.
  returned: always
  type: str
  sample: ""
executable:
  description: Path of the installed C(berth) command.
  returned: always
  type: str
  sample: /opt/berth/bin/berth
"""

import hashlib
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

SKIPPED = ("__pycache__",)


def source_sha256(src):
    """Hash relative paths and contents of every file under `src`, in sorted order."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(f for f in files if not f.endswith(".pyc")):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, src).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def read_stamp(stamp):
    try:
        with open(stamp, encoding="ascii") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def install(module, src, venv, python):
    # Every user runs the runtime: a hardened root umask (027, 077) must not
    # leave the venv unreadable to them.
    os.umask(0o022)
    venv_python = os.path.join(venv, "bin", "python")
    if not os.access(venv_python, os.X_OK):
        module.run_command([python, "-m", "venv", "--system-site-packages", venv], check_rc=True)
    with tempfile.TemporaryDirectory(prefix="berth-build-") as tmp:
        # setuptools writes build/ and *.egg-info next to the source: keep src pristine.
        build_src = os.path.join(tmp, "src")
        shutil.copytree(src, build_src, ignore=shutil.ignore_patterns(*SKIPPED, "*.pyc"))
        module.run_command(
            [venv_python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
             "--no-cache-dir", "--force-reinstall", "--disable-pip-version-check", build_src],
            check_rc=True,
        )


def write_stamp(stamp, sha256):
    tmp = stamp + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(sha256 + "\n")
    os.replace(tmp, stamp)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            venv=dict(type="path", default="/opt/berth"),
            python=dict(type="path", default="/usr/bin/python3"),
        ),
        supports_check_mode=True,
    )
    src, venv, python = (module.params[k] for k in ("src", "venv", "python"))
    stamp = os.path.join(venv, ".source-sha256")
    executable = os.path.join(venv, "bin", "berth")
    if module.check_mode and not os.path.exists(src):
        # The task that copies the source there did not run for real.
        module.exit_json(changed=True, sha256="", previous_sha256=read_stamp(stamp),
                         executable=executable)
    if not os.path.isfile(os.path.join(src, "pyproject.toml")):
        module.fail_json(msg=f"src: {src} has no pyproject.toml")
    if not os.access(python, os.X_OK):
        module.fail_json(msg=f"python: {python} is not an executable")

    sha256 = source_sha256(src)
    previous = read_stamp(stamp)
    changed = previous != sha256 or not os.access(executable, os.X_OK)
    if changed and not module.check_mode:
        install(module, src, venv, python)
        write_stamp(stamp, sha256)
    module.exit_json(
        changed=changed,
        sha256=sha256,
        previous_sha256=previous,
        executable=executable,
        diff=dict(before=f"source-sha256: {previous}\n", after=f"source-sha256: {sha256}\n",
                  before_header=stamp, after_header=stamp),
    )


if __name__ == "__main__":
    main()
