"""playbooks/validate.yml decides from the slurm role's slurm_pending facts
whether a job can run: a check run before Slurm is installed says why and
stops; a real run (nothing pending) must always validate. Evaluated by a
real ansible-playbook over an inventory of hosts that are never contacted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def pending(tmp_path, host_vars):
    play = yaml.safe_load((REPO / "playbooks" / "validate.yml").read_text())
    expression = next(p for p in play if "validate_pending" in p.get("vars", {}))["vars"]["validate_pending"]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "slurm_controller": {"hosts": {"ctl": host_vars.get("ctl", {})}},
        "slurm_compute": {"hosts": {h: host_vars.get(h, {}) for h in ("cn1", "cn2")}}}}}))
    result = tmp_path / "pending.json"
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars": {"validate_pending": expression},
        "tasks": [{"ansible.builtin.copy": {"content": "{{ validate_pending | to_json }}",
                                            "dest": str(result)}}]}]))
    subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
                    "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                    str(tmp_path / "play.yml")],
                   check=True, capture_output=True, text=True,
                   env=dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false"))
    return json.loads(result.read_text())


@pytest.mark.parametrize("host_vars, expected", [
    ({}, []),  # validate.yml run on its own: no slurm role before it
    ({h: {"slurm_pending": False} for h in ("ctl", "cn1", "cn2")}, []),
    ({"ctl": {"slurm_pending": False}, "cn1": {"slurm_pending": True}, "cn2": {"slurm_pending": False}},
     ["cn1"]),
    ({h: {"slurm_pending": True} for h in ("ctl", "cn1", "cn2")}, ["ctl", "cn1", "cn2"]),
])
def test_only_hosts_with_slurm_pending_stop_the_validation(tmp_path, host_vars, expected):
    assert pending(tmp_path, host_vars) == expected
