"""Run one module of library/ the way a play runs it, and return its result."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
