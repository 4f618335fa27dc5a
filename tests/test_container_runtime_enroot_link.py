"""roles/container_runtime installs berth as `enroot` (tasks/enroot_link.yml),
run through ansible-playbook on localhost with the paths moved under tmp_path."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Link or unlink enroot
      ansible.builtin.include_role:
        name: container_runtime
        tasks_from: enroot_link.yml
"""


@pytest.fixture
def node(tmp_path):
    """A pretend node: the venv's bin/berth, empty /usr/bin and /usr/local/bin."""
    (tmp_path / "venv/bin").mkdir(parents=True)
    (tmp_path / "venv/bin/berth").write_text("#!/bin/sh\n")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def apply(node, **variables):
    """Run the tasks; return (exit status, changed count, output)."""
    variables = {
        "container_runtime_venv": str(node / "venv"),
        "container_runtime_enroot_link_path": str(node / "usr/local/bin/enroot"),
        "container_runtime_enroot_paths": [str(node / "usr/bin/enroot"),
                                           str(node / "usr/local/bin/enroot")],
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    (node / "vars.json").write_text(json.dumps(variables))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
           "-c", "local", "-e", f"@{node / 'vars.json'}", str(node / "play.yml")]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), HOME=str(node),
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="false")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout)
    return done.returncode, int(recap.group(1)) if recap else None, done.stdout + done.stderr


def link(node):
    path = node / "usr/local/bin/enroot"
    return os.readlink(path) if path.is_symlink() else None


def test_links_enroot_to_berth_by_default_and_again_changes_nothing(node):
    status, changed, out = apply(node)
    assert status == 0 and changed == 1, out
    assert link(node) == str(node / "venv/bin/berth")
    status, changed, out = apply(node)
    assert status == 0 and changed == 0, out


def test_turned_off_removes_its_own_link_only(node):
    assert apply(node)[0] == 0
    status, changed, out = apply(node, container_runtime_enroot_link=False)
    assert status == 0 and changed == 1, out
    assert not (node / "usr/local/bin/enroot").exists()
    real = node / "usr/local/bin/enroot"
    real.write_text("#!/bin/sh\necho real enroot\n")
    status, changed, out = apply(node, container_runtime_enroot_link=False)
    assert status == 0 and changed == 0, out
    assert real.read_text() == "#!/bin/sh\necho real enroot\n"


@pytest.mark.parametrize("where", ["usr/bin/enroot", "usr/local/bin/enroot"])
def test_a_real_enroot_is_never_shadowed(node, where):
    assert apply(node)[0] == 0  # berth's link first, then the real enroot comes
    if where == "usr/local/bin/enroot":
        (node / where).unlink()
    (node / where).write_text("#!/bin/sh\necho real enroot\n")
    status, changed, out = apply(node)
    assert status == 0, out
    assert (node / where).read_text() == "#!/bin/sh\necho real enroot\n"
    if where == "usr/bin/enroot":  # the link in /usr/local/bin would come first on PATH
        assert changed == 1 and not (node / "usr/local/bin/enroot").exists(), out
    else:
        assert changed == 0, out
