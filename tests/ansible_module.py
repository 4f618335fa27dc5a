"""Run one module of library/ the way a play runs it, and return its result;
or a small playbook of a role's tasks on localhost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the module under test
      {module}: "{{{{ module_args }}}}"
      register: result
      ignore_errors: true
    - name: Save its result for the test
      ansible.builtin.copy:
        content: "{{{{ result | to_json }}}}"
        dest: "{{{{ result_file }}}}"
      check_mode: false
"""


def run_module(tmp_path, module, module_args, check=False, umask=0o022):
    """ansible-playbook of one task calling `module`; its registered result.
    check: --check --diff; umask: the umask the play (and module) runs under."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(module=module))
    extra = tmp_path / "extra.json"
    result_file = tmp_path / "result.json"
    extra.write_text(json.dumps({"module_args": module_args, "result_file": str(result_file)}))
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"),
               ANSIBLE_MODULE_UTILS=str(REPO / "plugins" / "module_utils"),
               ANSIBLE_DEPRECATION_WARNINGS="false")
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
           "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
           "-e", f"@{extra}", str(play)]
    if check:
        cmd += ["--check", "--diff"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True,
                   preexec_fn=lambda: os.umask(umask))
    return json.loads(result_file.read_text())


def run_playbook(tmp_path, playbook, extra_vars, **env):
    """ansible-playbook of `playbook` (a list of plays) on localhost with
    `extra_vars` over everything (as an inventory's would be) and `env` over
    the environment: (exit status, its output)."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump(playbook))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_DEPRECATION_WARNINGS="false", ANSIBLE_NOCOLOR="1", **env)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{extra}", str(play)],
        env=env, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr
