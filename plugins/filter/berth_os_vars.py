"""berth_os_vars_files: the vars files of a role for one host, in the order
they are loaded.

    (role_path ~ '/vars') | berth_os_vars_files(ansible_facts)
      -> ['.../vars/Debian.yml', '.../vars/Debian-13.yml']

First the family's file (Debian.yml: the names of the oldest supported
release, which Ubuntu shares; RedHat.yml), then the release's own file where
the role has one (Debian-13.yml: only what that release changes). Every role
with per-OS names loads them so, through the os_vars role it imports first,
and playbooks/upgrade.yml loads them through that role too, so that an
upgrade names the packages the roles installed. (A first_found over one
file per release would have each release's file repeat every name of its
family's.)
"""

import os
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

_FACTS = ("os_family", "distribution", "distribution_major_version")


def berth_os_vars_files(vars_dir, facts):
    if not isinstance(facts, Mapping) or not all(isinstance(facts.get(key), str) and facts[key]
                                                 for key in _FACTS):
        raise AnsibleFilterError("berth_os_vars_files: the host's facts need "
                                 + ", ".join(_FACTS) + " (gather_facts)")
    files = [os.path.join(vars_dir, f"{facts['os_family']}.yml")]
    release = os.path.join(vars_dir, f"{facts['distribution']}-"
                                     f"{facts['distribution_major_version']}.yml")
    if os.path.isfile(release):
        files.append(release)
    return files


class FilterModule:
    def filters(self):
        return {"berth_os_vars_files": berth_os_vars_files}
