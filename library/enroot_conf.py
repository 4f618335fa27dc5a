#!/usr/bin/python
"""Ansible module: write enroot.conf from a dict of validated settings."""

DOCUMENTATION = r"""
---
module: enroot_conf
short_description: Write an enroot.conf for the berth (or enroot) runtime
description:
  - Writes C(KEY VALUE) lines, one per setting, sorted by key, to an enroot.conf file.
  - Every key must be one the runtime knows; an unknown key, a flag that is not
    yes/no, or a count that is not a whole number fails the task with a message
    naming the key, and leaves the file as it was.
  - Values are written as given, so a site's shell forms are kept, C($(id -u)),
    C(${UID}), C(${TMPDIR:-/tmp}) and C(~/) among them; the runtime reads them as
    enroot's shell does (see the enroot.conf reference page).
  - The whole file is owned by this module; lines not in O(settings) are removed.
version_added: "0.1.0"
options:
  path:
    description: The file to write. Its directory must exist (in check mode it may be missing).
    type: path
    default: /etc/enroot/enroot.conf
  settings:
    description:
      - Mapping of C(ENROOT_*) keys to values. Flags take booleans or
        yes/no/true/false/1/0/y/n and are written as yes/no.
      - C(NVIDIA_*) and C(MELLANOX_*) keys are variables the hooks run with
        (C(NVIDIA_DRIVER_CAPABILITIES), ...), written as text.
    type: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Keep containers on node-local storage
  enroot_conf:
    path: /etc/enroot/enroot.conf
    settings:
      ENROOT_RUNTIME_PATH: /run/berth/${UID}
      ENROOT_DATA_PATH: /var/lib/berth/data/${UID}
      ENROOT_SQUASH_OPTIONS: -comp zstd -Xcompression-level 3
      ENROOT_ALLOW_HTTP: false
    mode: "0644"
"""

RETURN = r"""
path:
  description: The file written.
  returned: always
  type: str
  sample: /etc/enroot/enroot.conf
settings:
  description: The settings as written, values normalised (flags as yes/no).
  returned: success
  type: dict
  sample: {"ENROOT_ALLOW_HTTP": "no"}
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.berth_enroot_keys import conf_value

HEADER = "# Managed by Ansible (enroot_conf): local changes are overwritten.\n"


def render(settings):
    """The file text for `settings`; ValueError names the first bad key."""
    values = {key: conf_value(key, value) for key, value in settings.items()}
    body = "".join(f"{key} {values[key]}\n" for key in sorted(values))
    return HEADER + body, values


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def write(module, path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".enroot.conf.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    module.atomic_move(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/enroot/enroot.conf"),
            settings=dict(type="dict", required=True),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        text, values = render(module.params["settings"])
    except ValueError as e:
        module.fail_json(msg=str(e), path=path)
    # In check mode the directory may be one an earlier task would have made.
    if not module.check_mode and not os.path.isdir(os.path.dirname(path)):
        module.fail_json(msg=f"{path}: directory {os.path.dirname(path)} does not exist", path=path)

    before = read(path)
    changed = before != text
    if changed and not module.check_mode:
        write(module, path, text)
    file_args = module.load_file_common_arguments(module.params)
    changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(
        changed=changed,
        path=path,
        settings=values,
        diff=dict(before=before, after=text, before_header=path, after_header=path),
    )


if __name__ == "__main__":
    main()
