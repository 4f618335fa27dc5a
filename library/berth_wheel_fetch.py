#!/usr/bin/python
"""Ansible module: find or download, on the controller, the wheels of berth build's packages."""

DOCUMENTATION = r"""
---
module: berth_wheel_fetch
short_description: Find or download the wheels of the runtime's build packages for one node's Python
description:
  - "Runs on the controller (C(delegate_to: localhost)). For each package of O(packages) that
    O(python_version) can run, finds its wheel for that CPython and O(machine) in O(wheel_dir)
    (an offline site's own copies), else in a per-tag subdirectory of O(cache), where a missing
    one is downloaded once with C(pip download --only-binary=:all: --no-deps)."
  - Downloads land in a temporary directory first and are moved into the cache whole, so
    hosts fetching at once never see half a wheel.
  - In check mode nothing is downloaded; a wheel that would be reports a change.
version_added: "0.1.0"
options:
  packages:
    description:
      - The pinned packages, each with C(name), C(version) and C(python)
        (the oldest CPython it runs on).
    type: list
    elements: dict
    required: true
  python_version:
    description: The node's CPython, C(MAJOR.MINOR).
    type: str
    required: true
  machine:
    description: The node's machine (C(x86_64), C(aarch64)).
    type: str
    required: true
  glibc:
    description: The node's glibc version, C(MAJOR.MINOR); the newest manylinux tag it takes.
    type: str
    required: true
  wheel_dir:
    description: A directory of wheels the admin provides; when set, nothing is downloaded.
    type: path
    default: ""
  cache:
    description: The controller's download cache.
    type: path
    required: true
attributes:
  check_mode:
    support: full
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Fetch the build wheels
  berth_wheel_fetch:
    packages: [{name: dockerfile, version: 3.4.0, python: "3.9"}]
    python_version: "3.11"
    machine: x86_64
    glibc: "2.36"
    cache: ~/.cache/berth/wheels
  delegate_to: localhost
"""

RETURN = r"""
files:
  description: The wheels the node needs, on the controller (in check mode, those already there).
  returned: always
  type: list
  elements: str
requirements:
  description: C(NAME==VERSION) of each package the node's Python runs.
  returned: always
  type: list
  elements: str
"""

import os
import re
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule


def version_tuple(text):
    return tuple(int(part) for part in text.split("."))


def wheel_in(directory, package, machine):
    """The path of `package`'s wheel in `directory` that runs on `machine`, or None."""
    stem = re.sub(r"[-_.]+", "_", package["name"]).lower() + "-" + package["version"] + "-"
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return None
    for name in names:
        platform = name[:-len(".whl")].rsplit("-", 1)[-1] if name.endswith(".whl") else ""
        runs_there = platform == "any" or platform.endswith("_" + machine)
        if name.lower().startswith(stem) and runs_there:
            return os.path.join(directory, name)
    return None


def download(module, package, *, directory, tag):
    """Fetch `package`'s wheel for `tag` (python, machine, glibc) into `directory`."""
    python, machine, glibc = tag
    major, minor = version_tuple(glibc)[:2]
    # pip takes the newest manylinux tag literally: name every older one too.
    platforms = [arg for n in range(minor, 4, -1)
                 for arg in ("--platform", f"manylinux_{major}_{n}_{machine}")]
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as tmp:
        requirement = f"{package['name']}=={package['version']}"
        rc, out, err = module.run_command(
            [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
             "--disable-pip-version-check", "--implementation", "cp", "--python-version", python,
             *platforms, "--dest", tmp, requirement])
        found = wheel_in(tmp, package, machine)
        if rc != 0 or found is None:
            reason = (err.strip().splitlines() or ["pip found no such wheel"])[-1]
            module.fail_json(msg=f"{requirement}: cannot download its wheel for CPython "
                                 f"{python} on {machine} ({reason}): put it in "
                                 "container_runtime_build_wheel_dir, "
                                 "or set container_runtime_build: false")
        final = os.path.join(directory, os.path.basename(found))
        os.replace(found, final)
    return final


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="dict", required=True),
            python_version=dict(type="str", required=True),
            machine=dict(type="str", required=True),
            glibc=dict(type="str", required=True),
            wheel_dir=dict(type="path", default=""),
            cache=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    tag = (p["python_version"], p["machine"], p["glibc"])
    wanted = [pkg for pkg in p["packages"]
              if version_tuple(p["python_version"]) >= version_tuple(str(pkg["python"]))]
    # One cache directory per tag: a wheel for a newer glibc is not another node's.
    subdirectory = f"cp{tag[0].replace('.', '')}-manylinux_{tag[2].replace('.', '_')}_{tag[1]}"
    directory = p["wheel_dir"] or os.path.join(p["cache"], subdirectory)
    files, changed = [], False
    for package in wanted:
        found = wheel_in(directory, package, p["machine"])
        if found is None and p["wheel_dir"]:
            module.fail_json(msg=f"{package['name']}=={package['version']}: "
                                 f"container_runtime_build_wheel_dir {directory} has no wheel of "
                                 f"it for {p['machine']}: add it (pip download --only-binary=:all: "
                                 f"--no-deps --python-version {tag[0]} ...), "
                                 "or set container_runtime_build: false")
        if found is None:
            changed = True
            if module.check_mode:
                continue
            found = download(module, package, directory=directory, tag=tag)
        files.append(found)
    module.exit_json(changed=changed, files=files,
                     requirements=[f"{pkg['name']}=={pkg['version']}" for pkg in wanted])


if __name__ == "__main__":
    main()
