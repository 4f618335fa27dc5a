"""roles/slurm and roles/slurm_dbd per Debian release: each role's
os_vars role, run by ansible-playbook with a host's facts set to Debian 12
(bookworm, Slurm 22.05) or Debian 13 (trixie, Slurm 24.11), loads Debian.yml and
then the release's own file where there is one; slurm.conf, slurmdbd.conf and
the package lists are rendered from what it loaded.

Debian 12 must keep what the roles wrote before vars were per release; Debian 13
gets PMIx 5's package name, CredType instead of the CryptoType 24.11 deprecates,
and pid files in the runtime directories of its daemons, which run as slurm.
The slurm role's preflight refuses an MpiDefault the release has no plugin for.

Every role with per-OS names loads them the same way (the os_vars role), and
on every platform docs/admin/prerequisites.md lists gets the values it had when munge,
container_runtime and spank_plugin still loaded theirs each its own way
(tests/fixtures/os_vars_by_platform.json, written by the earlier ways)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

NODE_FACTS = ("ansible_processor_vcpus: 8, ansible_processor_count: 1, ansible_processor_cores: 8, "
              "ansible_processor_threads_per_core: 1, ansible_memtotal_mb: 16000")

INVENTORY = f"""
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {sys.executable}
    ansible_architecture: x86_64
    slurm_dbd_storage_password: secret-password
  children:
    slurm_controller:
      hosts:
        head01: {{ansible_hostname: head01}}
    slurm_login:
      hosts:
        head01:
    slurm_compute:
      hosts:
        cn1: {{ansible_hostname: cn1, {NODE_FACTS}}}
"""

# set_fact with cacheable puts the facts where gathered ones go: the roles
# read the release from ansible_facts.
RELEASE_FACTS = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Pretend to be the release under test
      ansible.builtin.set_fact:
        os_family: "{{ family }}"
        distribution: "{{ distro }}"
        distribution_major_version: "{{ major }}"
        cacheable: true
"""

# public: the roles' defaults and vars/main.yml, for the templates; the
# slurm role's preflight loads its names as the role does.
RENDER = """
    - name: Load the slurm role's variables and names
      ansible.builtin.include_role:
        name: slurm
        tasks_from: preflight.yml
        public: true

    - name: Load the slurm_dbd role's variables
      ansible.builtin.include_role:
        name: slurm_dbd
        tasks_from: preflight.yml
        public: true

    - name: Load the slurm_dbd role's names as the role does
      ansible.builtin.include_role:
        name: os_vars
      vars:
        os_vars_role: slurm_dbd

    - name: Write this host's Slurm packages
      ansible.builtin.copy:
        content: "{{ slurm_host_packages | to_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.packages.json"
        mode: "0644"

    - name: Render slurm.conf
      ansible.builtin.template:
        src: "{{ repo }}/roles/slurm/templates/slurm.conf.j2"
        dest: "{{ out }}/slurm.conf"
        mode: "0644"
      run_once: true

    - name: Render slurmdbd.conf
      ansible.builtin.template:
        src: "{{ repo }}/roles/slurm_dbd/templates/slurmdbd.conf.j2"
        dest: "{{ out }}/slurmdbd.conf"
        mode: "0600"
      run_once: true
      delegate_to: head01
"""


def ansible_playbook(tmp_path, inventory_text, play_text, *extra):
    """ansible-playbook of RELEASE_FACTS and `play_text` on that inventory."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(inventory_text)
    play = tmp_path / "play.yml"
    play.write_text(RELEASE_FACTS + play_text)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_DEPRECATION_WARNINGS="false",
               ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [BIN / "ansible-playbook", "-i", inventory, play, "-e", f"repo={REPO}", *extra],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO,
    )


def run_play(tmp_path, play_text, distro, major, *extra, family="Debian"):
    """ansible-playbook of `play_text` on hosts of that release."""
    return ansible_playbook(tmp_path, INVENTORY, play_text, "-e", f"family={family}",
                            "-e", f"distro={distro}", "-e", f"major={major}", *extra)


def render(tmp_path, distro, major, family="Debian"):
    """What the roles write for hosts of that release: {name: text or package list}."""
    out = tmp_path / f"{distro}-{major}"
    out.mkdir()
    result = run_play(tmp_path, RENDER, distro, major, "-e", f"out={out}", family=family)
    assert result.returncode == 0, result.stdout[-3000:]
    return {
        "slurm.conf": (out / "slurm.conf").read_text(),
        "slurmdbd.conf": (out / "slurmdbd.conf").read_text(),
        "head01": json.loads((out / "head01.packages.json").read_text()),
        "cn1": json.loads((out / "cn1.packages.json").read_text()),
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return {major: render(tmp_path_factory.mktemp(f"debian{major}"), "Debian", major) for major in ("12", "13")}


def lines(text):
    return set(text.splitlines())


def test_debian_12_keeps_slurm_22_05s_keys_and_pmix_4_packages(rendered):
    bookworm = rendered["12"]
    conf = lines(bookworm["slurm.conf"])
    assert {"CryptoType=crypto/munge", "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid"} <= conf
    assert "CredType" not in bookworm["slurm.conf"]
    assert "PidFile=/run/slurmdbd.pid" in lines(bookworm["slurmdbd.conf"])
    # 22.05's mpi_pmix_v4.so opens libpmix.so, which only the -dev package links
    assert bookworm["head01"] == ["slurmctld", "slurm-client", "libpmix2", "libpmix-dev"]
    assert bookworm["cn1"] == ["slurmd", "slurm-client", "libpmix2", "libpmix-dev"]


def test_debian_13_gets_slurm_24_11s_keys_pid_files_and_pmix_5_packages(rendered):
    trixie = rendered["13"]
    conf = lines(trixie["slurm.conf"])
    assert {"CredType=cred/munge", "SlurmctldPidFile=/run/slurmctld/slurmctld.pid",
            "SlurmdPidFile=/run/slurmd.pid"} <= conf
    assert "CryptoType" not in trixie["slurm.conf"]
    assert "/run/slurmctld.pid" not in trixie["slurm.conf"]
    assert "PidFile=/run/slurmdbd/slurmdbd.pid" in lines(trixie["slurmdbd.conf"])
    assert "/run/slurmdbd.pid" not in trixie["slurmdbd.conf"]
    # libpmix2 is only a name libpmix2t64 provides there; no -dev package
    assert trixie["head01"] == ["slurmctld", "slurm-client", "libpmix2t64"]
    assert trixie["cn1"] == ["slurmd", "slurm-client", "libpmix2t64"]


def test_the_releases_differ_only_in_those_lines(rendered):
    bookworm, trixie = rendered["12"], rendered["13"]
    assert lines(bookworm["slurm.conf"]) ^ lines(trixie["slurm.conf"]) == {
        "CryptoType=crypto/munge", "CredType=cred/munge",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmctldPidFile=/run/slurmctld/slurmctld.pid"}
    assert lines(bookworm["slurmdbd.conf"]) ^ lines(trixie["slurmdbd.conf"]) == {
        "PidFile=/run/slurmdbd.pid", "PidFile=/run/slurmdbd/slurmdbd.pid"}


def test_a_release_without_its_own_file_gets_the_familys(tmp_path, rendered):
    # Ubuntu 24.04 is of the Debian family and has no Ubuntu-24.yml
    noble = render(tmp_path, "Ubuntu", "24")
    assert noble == rendered["12"]


PREFLIGHT = """
    - name: Check the settings as playbooks/preflight.yml does
      ansible.builtin.include_role:
        name: slurm
        tasks_from: preflight.yml
"""


@pytest.mark.parametrize("major, plugin, refused", [
    ("12", "pmix_v4", False), ("12", "pmix_v5", True),
    ("13", "pmix_v5", False), ("13", "pmix_v4", True),
    ("13", "pmix", False),
])
def test_preflight_refuses_the_other_releases_pmix_plugin(tmp_path, major, plugin, refused):
    result = run_play(tmp_path, PREFLIGHT, "Debian", major, "-e", f"slurm_mpi_default={plugin}")
    assert (result.returncode != 0) == refused, result.stdout[-3000:]
    if refused:
        assert f"slurm_mpi_default={plugin}, but its Slurm (Debian {major})" in result.stdout


# Each platform of docs/admin/prerequisites.md's table, as its facts name it.
PLATFORMS = {
    "Debian-12": ("Debian", "Debian", "12"), "Debian-13": ("Debian", "Debian", "13"),
    "Ubuntu-22": ("Debian", "Ubuntu", "22"), "Ubuntu-24": ("Debian", "Ubuntu", "24"),
    "RedHat-9": ("RedHat", "RedHat", "9"), "Rocky-9": ("RedHat", "Rocky", "9"),
    "AlmaLinux-9": ("RedHat", "AlmaLinux", "9"),
}
BEFORE = json.loads((REPO / "tests" / "fixtures" / "os_vars_by_platform.json").read_text())
# The roles with per-OS names: a vars file besides main.yml.
OS_VARS_ROLES = sorted(role.name for role in (REPO / "roles").iterdir()
                       if any(f.name != "main.yml" for f in (role / "vars").glob("*.yml")))

LOAD_EVERY_ROLE = "".join(f"""
    - name: Load the {role} role's names as the role does
      ansible.builtin.include_role:
        name: os_vars
      vars:
        os_vars_role: {role}
""" for role in OS_VARS_ROLES) + """
    - name: Write what each role loaded
      ansible.builtin.copy:
        content: "{{ dict(item.value | zip(item.value | map('extract', vars))) | to_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.{{ item.key }}.json"
        mode: "0644"
      loop: "{{ names | dict2items }}"
"""


def test_every_role_loads_on_every_platform_what_it_loaded_before(tmp_path):
    names = {role: sorted(set().union(*(yaml.safe_load(f.read_text())
                                        for f in (REPO / "roles" / role / "vars").glob("*.yml")
                                        if f.name != "main.yml")))
             for role in OS_VARS_ROLES}
    # a name added to a vars file is added to the fixture on purpose
    assert names == {role: sorted(values) for role, values in BEFORE["Debian-12"].items()}
    hosts = "".join(f"        {platform}: {{family: {family}, distro: {distro}, major: '{major}'}}\n"
                    for platform, (family, distro, major) in PLATFORMS.items())
    inventory = (f"all:\n  vars:\n    ansible_connection: local\n"
                 f"    ansible_python_interpreter: {sys.executable}\n    ansible_architecture: x86_64\n"
                 f"  children:\n    platforms:\n      hosts:\n{hosts}")
    result = ansible_playbook(tmp_path, inventory, LOAD_EVERY_ROLE, "-e", f"out={tmp_path}",
                              "-e", json.dumps({"names": names}))
    assert result.returncode == 0, result.stdout[-3000:]
    assert set(BEFORE) == set(PLATFORMS)
    for platform in PLATFORMS:
        loaded = {role: json.loads((tmp_path / f"{platform}.{role}.json").read_text()) for role in OS_VARS_ROLES}
        assert loaded == BEFORE[platform], platform
