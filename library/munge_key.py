#!/usr/bin/python
# Copyright: Berth contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install a munge key from base64 without passing the bytes through text."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: munge_key
short_description: Install a binary munge key, binary-safe and idempotent
description:
  - Writes the munge key given in base64 to O(path), atomically, with the
    owner and mode munged requires.
  - Unlike M(ansible.builtin.copy) with C(content), the key bytes never pass
    through text, so binary keys made by C(mungekey) survive intact.
  - The key never appears in the result or in the diff.
options:
  key_b64:
    description: The key, base64-encoded (for example the C(content) of M(ansible.builtin.slurp)).
    type: str
    required: true
  path:
    description: Where the key lives.
    type: path
    default: /etc/munge/munge.key
  owner:
    description: Owner of the key file.
    type: str
    default: munge
  group:
    description: Group of the key file.
    type: str
    default: munge
  mode:
    description: Mode of the key file.
    type: raw
    default: "0400"
  min_bytes:
    description: Smallest key munged accepts.
    type: int
    default: 32
  max_bytes:
    description: Largest key munged accepts.
    type: int
    default: 1024
attributes:
  check_mode:
    support: full
  diff_mode:
    support: partial
    details: The diff says whether the key changes, never what it is.
author:
  - Berth contributors
"""

EXAMPLES = r"""
- name: Read the controller's key
  ansible.builtin.slurp:
    src: /etc/munge/munge.key
  register: controller_key
  delegate_to: "{{ groups['slurm_controller'][0] }}"
  run_once: true
  no_log: true

- name: Install it on every node
  munge_key:
    key_b64: "{{ controller_key.content }}"
  no_log: true
"""

RETURN = r"""
path:
  description: The key file.
  returned: always
  type: str
  sample: /etc/munge/munge.key
size:
  description: Length of the key in bytes.
  returned: always
  type: int
  sample: 1024
"""

import base64
import binascii
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def decode_key(module):
    try:
        key = base64.b64decode(module.params["key_b64"], validate=True)
    except (binascii.Error, ValueError):
        module.fail_json(msg="munge_key: key_b64 is not valid base64")
    low, high = module.params["min_bytes"], module.params["max_bytes"]
    if not low <= len(key) <= high:
        module.fail_json(
            msg=f"munge_key: key_b64 decodes to {len(key)} bytes; "
                f"munged needs {low} to {high} bytes"
        )
    return key


def current_key(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write_key(path, key):
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".munge.key.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        os.chmod(tmp, 0o400)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            key_b64=dict(type="str", required=True, no_log=True),
            path=dict(type="path", default="/etc/munge/munge.key"),
            owner=dict(type="str", default="munge"),
            group=dict(type="str", default="munge"),
            mode=dict(type="raw", default="0400"),
            min_bytes=dict(type="int", default=32),
            max_bytes=dict(type="int", default=1024),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    key = decode_key(module)
    old = current_key(path)
    changed = old != key
    result = dict(
        changed=changed,
        path=path,
        size=len(key),
        diff=dict(
            before=("absent\n" if old is None
                    else "key (unchanged)\n" if not changed else "old key\n"),
            after="key (unchanged)\n" if not changed else "new key\n",
        ),
    )
    if changed and not module.check_mode:
        write_key(path, key)
    file_args = module.load_file_common_arguments(
        dict(path=path, owner=module.params["owner"], group=module.params["group"],
             mode=module.params["mode"])
    )
    if not module.check_mode or os.path.exists(path):
        result["changed"] = module.set_fs_attributes_if_different(file_args, result["changed"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
