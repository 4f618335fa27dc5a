"""The container_runtime role's AppArmor profile: installed only where
AppArmor restricts unprivileged user namespaces, attached to the program
the kernel execs for every berth (the venv's entry point script), and
loaded again whenever the kernel lacks it. The profile's syntax is checked
by lint (scripts/check-apparmor.sh, apparmor_parser -Q); no kernel of this
test bed has the restriction, so loading it is not tried here."""

import re
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parent.parent / "roles/container_runtime"


def tasks(name):
    return yaml.safe_load((ROLE / "tasks" / name).read_text())


def test_the_profile_is_included_only_where_apparmor_restricts_user_namespaces():
    include = next(t for t in tasks("main.yml") if t.get("ansible.builtin.include_tasks")
                   == "apparmor.yml")
    assert include["when"] == "container_runtime_userns.stdout_lines[1] | int == 1"
    read = next(t for t in tasks("preflight.yml") if t.get("register") == "container_runtime_userns")
    assert read["ansible.builtin.shell"]["cmd"].splitlines()[1] == (
        "cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null || echo 0")
    check = next(t for t in tasks("preflight.yml")
                 if t["name"] == "Check that unprivileged users may create user namespaces")
    assert check["ansible.builtin.assert"]["that"] == [
        "container_runtime_userns.stdout_lines[0] | int > 0"]


def test_the_profile_attaches_to_the_program_every_berth_runs():
    """/usr/local/bin/berth (the SPANK plugin's) links to the venv's entry
    point, the store's units run it, and the profile names it."""
    profile = (ROLE / "templates/apparmor-berth.j2").read_text()
    attached = re.search(r"^profile berth (.+?) flags=\(unconfined\) \{$", profile, re.M)
    assert attached and attached.group(1) == "{{ container_runtime_venv }}/bin/berth"
    assert re.search(r"^  userns,$", profile, re.M)
    link = next(t for t in tasks("install.yml") if t["name"] == "Put berth on the PATH")
    assert link["ansible.builtin.file"]["src"] == attached.group(1)
    assert link["ansible.builtin.file"]["dest"] == "/usr/local/bin/berth"
    for unit in ("berth-store@.service.j2", "berth-store-prune.service.j2"):
        text = (ROLE / "templates" / unit).read_text()
        assert f"ExecStart={attached.group(1)} " in text


def test_the_profile_is_loaded_when_written_or_missing_from_the_kernel():
    install, read, load = tasks("apparmor.yml")
    assert install["ansible.builtin.template"]["dest"] == "/etc/apparmor.d/berth"
    assert read["check_mode"] is False and read["changed_when"] is False
    assert load["ansible.builtin.command"] == (
        "apparmor_parser --replace --write-cache /etc/apparmor.d/berth")
    assert "check_mode" not in load  # so skipped in check mode, never run
    assert f"{install['register']} is changed" in load["when"]
    assert f"{read['register']}.stdout_lines | select('match', 'berth [(]')" in load["when"]
