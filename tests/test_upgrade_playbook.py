"""playbooks/upgrade.yml without a cluster: the order of its plays, that
compute nodes go one at a time and stop at the first failure, and its
expressions, evaluated by a real ansible-playbook on fabricated input: the
reason a failed node is left drained with, whether a node was drained before
the upgrade (and why), and the smoke step's command line. The Molecule
scenario runs the playbook itself (molecule/multinode/tests/test_day2.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = yaml.safe_load((REPO / "playbooks" / "upgrade.yml").read_text())


def play_named(words):
    return next(p for p in PLAYBOOK if "name" in p and words in p["name"])


COMPUTE = play_named("compute nodes")
NODE_BLOCK = next(t for t in COMPUTE["tasks"] if "block" in t)


def run(tmp_path, play):
    """Run `play` on localhost; what it wrote to result.json."""
    result = tmp_path / "result.json"
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"result={result}",
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, env=dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false"))
    assert result.exists(), proc.stdout[-3000:]
    return json.loads(result.read_text())


def save(expression):
    return {"ansible.builtin.copy": {"content": "{{ " + expression + " | to_json }}", "dest": "{{ result }}"}}


def test_plays_go_slurmdbd_slurmctld_login_then_compute_nodes_one_at_a_time():
    names = [p.get("name", "") for p in PLAYBOOK]
    order = [names.index(play_named(words)["name"])
             for words in ("slurmdbd", "slurmctld", "login nodes", "compute nodes")]
    assert order == sorted(order), names
    assert play_named("inputs")["name"] == names[0]
    assert COMPUTE["hosts"] == "slurm_compute"
    assert COMPUTE["serial"] == 1 and COMPUTE["max_fail_percentage"] == 0 and COMPUTE["any_errors_fatal"]
    assert play_named("slurmdbd")["hosts"] == "{{ (groups['slurm_dbd'] | default([]) or groups['slurm_controller'])[0] }}"
    steps = [t["name"] for t in NODE_BLOCK["block"]]
    for earlier, later in [("Reserve the node", "Drain the node"), ("Drain the node", "Wait until no job"),
                           ("Wait until no job", "Upgrade Slurm"), ("Upgrade Slurm", "Rebuild the SPANK plugin"),
                           ("Rebuild the SPANK plugin", "Restart slurmd"), ("Restart slurmd", "Resume the node"),
                           ("Resume the node", "Run a containerized smoke step"),
                           ("Run a containerized smoke step", "Stop at a failed smoke step"),
                           ("Stop at a failed smoke step", "Drain the node again"),
                           # a node drained before is drained again while still reserved
                           ("Drain the node again", "End the smoke step's reservation")]:
        first = next(i for i, s in enumerate(steps) if s.startswith(earlier))
        second = next(i for i, s in enumerate(steps) if s.startswith(later))
        assert first < second, (earlier, later, steps)
    rescue = [t["name"] for t in NODE_BLOCK["rescue"]]
    assert rescue[0].startswith("Leave the node drained") and rescue[-1].startswith("Stop the upgrade")


SMOKE = next(t for t in NODE_BLOCK["block"] if t["name"] == "Stop at a failed smoke step")


@pytest.mark.playbook
@pytest.mark.parametrize("rc, stdout, stderr, message", [
    (1, "", "srun: job 12 queued and waiting for resources\nsrun: error: Unable to allocate resources: x",
     "smoke step failed: srun: error: Unable to allocate resources: x"),
    (1, "", "spank_berth: /opt/nope.sqsh: No such file or directory\nsrun: error: task 0 launch failed",
     "smoke step failed: spank_berth: /opt/nope.sqsh: No such file or directory"),
    (2, "", "", "smoke step failed: srun exit 2"),
    (3, "  \nsomething else", "", "smoke step failed: something else"),
    (124, "", "srun: error: x", "smoke step failed: no answer within 600 s"),
])
def test_a_failed_smoke_step_says_why_in_one_line(tmp_path, rc, stdout, stderr, message):
    result = {"rc": rc, "stdout_lines": stdout.split("\n") if stdout else [],
              "stderr_lines": stderr.split("\n") if stderr else []}
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {**COMPUTE["vars"], "upgrade_smoke": result},
             "tasks": [{"block": [SMOKE], "rescue": [save("ansible_failed_result.msg")]}]}]
    assert run(tmp_path, play) == message


def failing_block(task):
    """A block whose task fails, rescued with upgrade.yml's own reason expressions."""
    return [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Fail as a node's upgrade step would", "vars": NODE_BLOCK["vars"],
        "block": [task], "rescue": [save("upgrade_failure_reason")]}]}]


@pytest.mark.playbook
@pytest.mark.parametrize("task, reason", [
    ({"name": "Stop at a failed smoke step",
      "ansible.builtin.fail": {"msg": "smoke step failed: spank_berth: /x.sqsh: No such file or directory"}},
     "berth upgrade: smoke step failed: spank_berth: /x.sqsh: No such file or directory"),
    ({"name": "Wait until no job runs on the node",
      "ansible.builtin.command": {"argv": ["sh", "-c", "echo; echo 'squeue: error: slurm_load_jobs: timed out' >&2; exit 1"]}},
     "berth upgrade: Wait until no job runs on the node failed: squeue: error: slurm_load_jobs: timed out"),
    ({"name": "Upgrade the installed Slurm packages", "ansible.builtin.fail": {"msg": "no\nsecond line"}},
     "berth upgrade: Upgrade the installed Slurm packages failed: no"),
])
def test_the_reason_a_failed_node_is_left_drained_with(tmp_path, task, reason):
    assert run(tmp_path, failing_block(task)) == reason


@pytest.mark.playbook
def test_the_reason_is_one_line_of_at_most_215_characters(tmp_path):
    task = {"name": "Stop at a failed smoke step",
            "ansible.builtin.fail": {"msg": "smoke step failed: " + "x\ty " * 100}}
    reason = run(tmp_path, failing_block(task))
    assert reason.startswith("berth upgrade: smoke step failed: x y x y")
    assert len(reason) <= len("berth upgrade: ") + 200 and "\t" not in reason


SHOW_NODE = """NodeName=cn1 Arch=x86_64 CoresPerSocket=1
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A
   BootTime=2024-01-01T00:00:00 SlurmdStartTime=2024-01-01T00:00:00
{reason}"""


@pytest.mark.playbook
@pytest.mark.parametrize("state, reason, drained, before", [
    ("IDLE", "", False, ""),
    ("MIXED", "", False, ""),
    ("IDLE+DRAIN", "   Reason=bad GPU 3 [root@2024-01-02T10:00:00]", True, "bad GPU 3"),
    ("MIXED+DRAIN", "   Reason=fan [admin@2024-01-02T10:00:00]", True, "fan"),
    # left by an earlier upgrade run that failed: this run resumes it
    ("IDLE+DRAIN", "   Reason=berth upgrade: smoke step failed: x [root@2024-01-02T10:00:00]", False,
     "berth upgrade: smoke step failed: x"),
])
def test_a_node_drained_before_by_someone_else_stays_drained(tmp_path, state, reason, drained, before):
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {**COMPUTE["vars"],
                      "upgrade_node_before": {"stdout": SHOW_NODE.format(state=state, reason=reason)}},
             "tasks": [save("[upgrade_drained_before, upgrade_reason_before]")]}]
    assert run(tmp_path, play) == [drained, before]


@pytest.mark.playbook
@pytest.mark.parametrize("extra, tail", [
    ({}, ["--container-image=/opt/berth-images/mpi-test.sqsh", "true"]),
    ({"berth_upgrade_smoke_image": "nvcr.io#nvidia/cuda:12", "berth_upgrade_smoke_command": "nvidia-smi -L"},
     ["--container-image=nvcr.io#nvidia/cuda:12", "nvidia-smi", "-L"]),
    ({"berth_upgrade_smoke_command": ["sh", "-c", "test -e /etc/os-release"]},
     ["--container-image=/opt/berth-images/mpi-test.sqsh", "sh", "-c", "test -e /etc/os-release"]),
])
def test_smoke_step_runs_as_the_user_pinned_to_the_node_in_its_reservation(tmp_path, extra, tail):
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {**COMPUTE["vars"], "ansible_hostname": "cn1", "berth_validate_user": "alice",
                      "berth_validate_image": "/opt/berth-images/mpi-test.sqsh", **extra},
             "tasks": [save("upgrade_smoke_argv")]}]
    assert run(tmp_path, play) == [
        "timeout", "600", "runuser", "-u", "alice", "--", "srun", "--reservation=berth-upgrade-cn1",
        "-w", "cn1", "-N1", "-n1", "--immediate=120", *tail]


def test_restarts_and_names_come_from_the_roles_own_tasks_and_handlers():
    text = "".join((REPO / "playbooks" / name).read_text() for name in ("upgrade.yml", "tasks/upgrade_packages.yml"))
    assert "include_vars" not in text and "roles/" not in text and "systemd_service" not in text
    dbd = play_named("slurmdbd")["tasks"]
    assert [t.get("notify") for t in dbd if "register" in t] == ["Restart slurmdbd", "Restart slurmdbd"]
    flush = next(i for i, t in enumerate(dbd) if t.get("ansible.builtin.meta") == "flush_handlers")
    wait = dbd[flush + 1]
    assert wait["ansible.builtin.include_role"] == {"name": "slurm_dbd", "tasks_from": "wait.yml"}
    assert wait["vars"]["slurm_dbd_answer_timeout"] == "{{ berth_upgrade_slurmdbd_timeout | default(3600) | int }}"
    ctld = play_named("slurmctld")["tasks"]
    assert ctld[1]["ansible.builtin.include_role"] == {"name": "slurm", "tasks_from": "restart_slurmctld.yml"}
    handlers = yaml.safe_load((REPO / "roles" / "slurm" / "handlers" / "main.yml").read_text())
    assert next(h for h in handlers if h["name"] == "Restart slurmctld")[
        "ansible.builtin.include_tasks"] == "restart_slurmctld.yml"


def test_the_plugins_package_names_it_upgrades_are_in_every_platforms_vars():
    """upgrade_packages.yml loads the spank_plugin role's platform files
    alone (not its vars/main.yml): a name it uses from that role must be
    in each of them, or every node's upgrade stops at an undefined name."""
    text = (REPO / "playbooks" / "tasks" / "upgrade_packages.yml").read_text()
    used = set(re.findall(r"\bspank_plugin_[a-z_]+\b", text))
    assert used
    for platform in (REPO / "roles" / "spank_plugin" / "vars").glob("*.yml"):
        if platform.name != "main.yml":
            assert used <= set(yaml.safe_load(platform.read_text())), platform
