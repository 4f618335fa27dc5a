"""roles/container_runtime/templates/berth-login-user-dirs.sh.j2, rendered by
Ansible and run as pam_exec runs it when a session opens on a login node:
it makes the user's directories with `berth setup-user`, and whatever that
does (fails, hangs), the login goes on. A stand-in berth records how it was
called; the real setup-user has its own tests (test_userdirs.py), and the
PAM wiring is tested on the cluster (molecule test_login_node.py)."""

import subprocess
from pathlib import Path

import pytest

from ansible_module import run_playbook

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 2


@pytest.fixture(scope="module")
def hook(tmp_path_factory):
    top = tmp_path_factory.mktemp("login-hook")
    (top / "venv" / "bin").mkdir(parents=True)
    template = REPO / "roles/container_runtime/templates/berth-login-user-dirs.sh.j2"
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Render the login hook",
        "ansible.builtin.template": {"src": str(template), "dest": str(top / "berth-login-user-dirs"),
                                     "mode": "0755"}}]}]
    code, out = run_playbook(top, play, {
        "container_runtime_venv": str(top / "venv"),
        "container_runtime_login_user_dirs_timeout": TIMEOUT}, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    assert code == 0, out[-3000:]
    return top


def run(hook, berth_body, pam_type="open_session", user="alice"):
    """The hook as pam_exec runs it, with a berth that runs berth_body;
    return (the process, the arguments berth was called with or None)."""
    calls = hook / "calls"
    calls.unlink(missing_ok=True)
    berth = hook / "venv" / "bin" / "berth"
    berth.write_text(f'#!/bin/sh\necho "$@" > {calls}\n{berth_body}\n')
    berth.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PAM_TYPE": pam_type, "PAM_USER": user}
    proc = subprocess.run([hook / "berth-login-user-dirs"], env=env, capture_output=True,
                          text=True, timeout=30)
    return proc, calls.read_text().strip() if calls.exists() else None


def test_a_session_opening_makes_the_users_directories(hook):
    proc, calls = run(hook, "exit 0")
    assert proc.returncode == 0
    assert calls == "setup-user alice"


@pytest.mark.parametrize("pam_type", ["close_session", "auth", ""])
def test_nothing_else_runs_it(hook, pam_type):
    proc, calls = run(hook, "exit 0", pam_type=pam_type)
    assert (proc.returncode, calls) == (0, None)


def test_no_user_no_run(hook):
    proc, calls = run(hook, "exit 0", user="")
    assert (proc.returncode, calls) == (0, None)


def test_a_failing_setup_never_fails_the_login_nor_talks_to_her(hook):
    proc, calls = run(hook, "echo 'berth: warning: /home/alice/.config: not a directory' >&2; exit 1")
    assert (proc.returncode, proc.stdout) == (0, "")
    assert calls == "setup-user alice"


def test_a_hanging_setup_is_given_up_on(hook):
    # the user's part may hang (a stalled home); the login may not
    proc, calls = run(hook, "exec sleep 600")
    assert (proc.returncode, proc.stdout) == (0, "")
    assert calls == "setup-user alice"
