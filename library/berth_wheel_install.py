#!/usr/bin/python
"""Ansible module: install (or remove) pinned packages in the runtime's venv from local wheels."""

DOCUMENTATION = r"""
---
module: berth_wheel_install
short_description: Install pinned packages into the runtime's venv from local wheels, offline
description:
  - Asks the venv's interpreter which versions of the packages it has; installs those that
    differ from O(requirements) with C(pip install --no-index --find-links O(find_links) --no-deps),
    so nothing is fetched from the network.
  - With O(state=absent), uninstalls those of the packages that are installed.
  - In check mode it reports what it would do and changes nothing.
version_added: "0.1.0"
options:
  venv:
    description: The runtime's virtual environment.
    type: path
    required: true
  requirements:
    description: C(NAME==VERSION) of each package.
    type: list
    elements: str
    required: true
  find_links:
    description: Directory on the node holding the wheels.
    type: path
    default: ""
  state:
    description: Whether the packages should be installed.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Install berth build's packages
  berth_wheel_install:
    venv: /opt/berth
    requirements: [dockerfile==3.4.0]
    find_links: /opt/berth/wheels
"""

RETURN = r"""
installed:
  description:
    - The C(NAME==VERSION) installed (or to be, in check mode), or uninstalled with O(state=absent).
  returned: always
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

VERSIONS = """
import importlib.metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def installed_versions(module, python, names):
    rc, out, err = module.run_command([python, "-c", VERSIONS, *names])
    if rc != 0:
        module.fail_json(msg=f"venv: {python} cannot list its packages: {err.strip()}")
    return json.loads(out)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            requirements=dict(type="list", elements="str", required=True),
            find_links=dict(type="path", default=""),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python = os.path.join(p["venv"], "bin", "python")
    if not os.access(python, os.X_OK):
        if module.check_mode and p["state"] == "present":
            # The venv is made by a task before this one that did not run for real.
            module.exit_json(changed=True, installed=p["requirements"])
        if p["state"] == "absent":
            module.exit_json(changed=False, installed=[])
        module.fail_json(msg=f"venv: {p['venv']} has no bin/python")
    pins = dict(r.split("==", 1) for r in p["requirements"])
    have = installed_versions(module, python, list(pins))
    if p["state"] == "absent":
        todo = [f"{name}=={have[name]}" for name in pins if name in have]
        command = [python, "-m", "pip", "uninstall", "--yes", *pins]
    else:
        todo = [f"{name}=={version}" for name, version in pins.items() if have.get(name) != version]
        command = [python, "-m", "pip", "install", "--no-index", "--find-links", p["find_links"],
                   "--no-deps", "--no-cache-dir", *todo]
    if todo and not module.check_mode:
        os.umask(0o022)  # every user runs the runtime: a hardened root umask must not hide these
        command.append("--disable-pip-version-check")
        rc, out, err = module.run_command(command)
        if rc != 0:
            lines = err.strip().splitlines() or ["pip failed"]
            module.fail_json(msg=f"{', '.join(todo)}: pip cannot install them from "
                                 f"{p['find_links']}: {lines[-1]}")
    module.exit_json(changed=bool(todo), installed=todo)


if __name__ == "__main__":
    main()
