"""Run one module of library/ the way a play runs it, and return its result;
or a small playbook of a role's tasks on localhost; or call a module in this
process (the unit tier: what the module decides, without a play around it)."""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import ansible.module_utils
import yaml
from ansible.module_utils import basic

REPO = Path(__file__).resolve().parent.parent
# library/'s modules import plugins/module_utils/ as ansible.module_utils.*, as a play ships them
ansible.module_utils.__path__.append(str(REPO / "plugins" / "module_utils"))

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


def refuse_in_the_unit_tier():
    """A test of the unit tier (conftest.py sets BERTH_TEST_TIER for it) must
    not start ansible-playbook: it belongs to the playbook tier."""
    if os.environ.get("BERTH_TEST_TIER") == "unit":
        raise AssertionError("a unit-tier test runs ansible-playbook: mark it playbook (conftest.py)")


def run_module(tmp_path, module, module_args, check=False, umask=0o022):
    """ansible-playbook of one task calling `module`; its registered result.
    check: --check --diff; umask: the umask the play (and module) runs under."""
    refuse_in_the_unit_tier()
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


def call_module(module, module_args, check=False, umask=0o022):
    """`module` of library/ called in this process with `module_args`, as
    run_module would run it (check: check mode and diff): the result a play
    registers for it, "failed" and "msg" included when it fails."""
    spec = importlib.util.spec_from_file_location(f"library_{module}", REPO / "library" / f"{module}.py")
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    args = dict(module_args, _ansible_check_mode=check, _ansible_diff=check)
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    basic._ANSIBLE_PROFILE = "legacy"
    out = io.StringIO()
    old_umask = os.umask(umask)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            code.main()
    finally:
        os.umask(old_umask)
        basic._ANSIBLE_ARGS = None
    result = json.loads(out.getvalue())
    result.setdefault("changed", False)
    result.setdefault("failed", False)
    return result


def run_playbook(tmp_path, playbook, extra_vars, **env):
    """ansible-playbook of `playbook` (a list of plays) on localhost with
    `extra_vars` over everything (as an inventory's would be) and `env` over
    the environment: (exit status, its output)."""
    refuse_in_the_unit_tier()
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
