"""roles/edf_environments through ansible-playbook on localhost, in a tmp dir.

The EDFs are checked by the real runtime (`python -m berth.cli edf check`),
so a broken EDF must fail the play and leave the installed ones untouched.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "inventories" / "example" / "group_vars" / "all" / "edf.yml"
PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: edf_environments
"""


@pytest.fixture
def node(tmp_path):
    """Paths of a pretend node under tmp_path, hooks pmix/nvidia/mellanox installed."""
    hooks = tmp_path / "sysconf" / "hooks.d"
    hooks.mkdir(parents=True)
    for hook in ("50-pmix.sh", "90-nvidia.sh", "91-mellanox.sh"):
        (hooks / hook).write_text("#!/bin/sh\n")
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def apply(node, definitions, check=False, **extra_vars):
    """Run the role with `definitions`; return (exit status, changed count, output)."""
    berth = (f"env PYTHONPATH={REPO / 'runtime'} ENROOT_SYSCONF_PATH={node / 'sysconf'} "
             f"{sys.executable} -m berth.cli")
    variables = {
        "edf_environments_definitions": definitions,
        "edf_environments_dir": str(node / "edf"),
        "edf_environments_staging_dir": str(node / "staging"),
        "edf_environments_profile_script": str(node / "profile.d" / "berth-edf.sh"),
        "edf_environments_environment_file": str(node / "environment"),
        "edf_environments_berth_command": berth,
        "ansible_python_interpreter": sys.executable,
        **extra_vars,
    }
    (node / "vars.json").write_text(json.dumps(variables))
    (node / "profile.d").mkdir(exist_ok=True)
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
           "-c", "local", "-e", f"@{node / 'vars.json'}", str(node / "play.yml")]
    if check:
        cmd += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), HOME=str(node),
               ANSIBLE_DEPRECATION_WARNINGS="false", ANSIBLE_NOCOLOR="1")
    env.pop("SCRATCH", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=node)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout)
    return done.returncode, int(recap.group(1)) if recap else None, done.stdout + done.stderr


def snapshot(directory):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def example():
    return yaml.safe_load(EXAMPLE.read_text())["edf_environments_definitions"]


def berth_show(node, name):
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/alice", "PYTHONPATH": str(REPO / "runtime"),
           "EDF_PATH": str(node / "edf"), "ENROOT_SYSCONF_PATH": str(node / "sysconf")}
    out = subprocess.run([sys.executable, "-m", "berth.cli", "edf", "show", "--json", name],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


SCRATCH = {"scratch": {"base_environment": "site-defaults", "mounts": ["${SCRATCH}/data:/data"]}}


def test_install_resolve_rerun_and_remove(node):
    # ${SCRATCH} is unset for root: the stand-in value lets the check pass
    stand_in = {"edf_environments_check_environment": {"SCRATCH": "/s"}}
    status, changed, out = apply(node, {**example(), **SCRATCH}, **stand_in)
    assert status == 0, out
    assert sorted(p.name for p in (node / "edf").iterdir()) \
        == ["pytorch.toml", "scratch.toml", "site-defaults.toml"]
    assert tomllib.loads((node / "edf" / "pytorch.toml").read_text())["base_environment"] \
        == "site-defaults"
    pytorch = berth_show(node, "pytorch")
    assert pytorch["image"] == "nvcr.io#nvidia/pytorch:24.01-py3"
    assert pytorch["mounts"] == ["/home/alice:/home/alice", "/scratch:/scratch"]
    assert pytorch["hook_env"] == {"BERTH_HOOK_NVIDIA_ENABLE": "1", "BERTH_HOOK_MELLANOX_ENABLE": "1"}
    assert pytorch["sources"]["mounts./scratch"] == str(node / "edf" / "site-defaults.toml")
    edf_path = f"EDF_PATH={node / 'edf'}"
    assert f"{edf_path}\nexport EDF_PATH\n" in (node / "profile.d" / "berth-edf.sh").read_text()
    assert (node / "environment").read_text() == edf_path + "\n"

    assert apply(node, {**example(), **SCRATCH}, **stand_in)[:2] == (0, 0)

    # dropping environments removes the files the role wrote, not the admin's own
    (node / "edf" / "admin-own.toml").write_text('image = "kept"\n')
    before = snapshot(node / "edf")
    status, changed, out = apply(node, example(), check=True)
    assert (status, changed) == (0, 2), out  # staged and installed scratch.toml would go
    assert snapshot(node / "edf") == before
    assert apply(node, example())[:2] == (0, 2)
    assert sorted(p.name for p in (node / "edf").iterdir()) \
        == ["admin-own.toml", "pytorch.toml", "site-defaults.toml"]
    assert sorted(p.name for p in (node / "staging").iterdir()) \
        == ["pytorch.toml", "site-defaults.toml"]


def test_broken_sets_leave_installed_edfs_untouched(node):
    assert apply(node, example())[0] == 0
    before = snapshot(node / "edf")

    # site-defaults alone is fine; only checking the set shows the cycle
    status, _, out = apply(node, {**example(), "site-defaults": {"base_environment": "pytorch"}})
    assert status != 0
    assert "base_environment cycle: " in out
    assert snapshot(node / "edf") == before

    broken = {
        "pytorch": {**example()["pytorch"], "workdir": "/valid/change"},
        "bad-type": {"entrypoint": "no"},
        "unset-var": {"mounts": ["${SCRATCH}:/data"]},
        # (an annotation for a hook not installed is a warning: a misspelling is refused)
        "misspelt": {"annotations": {"com.hooks.nvidia.enabel": True}},
        "orphan": {"base_environment": "gone"},
    }
    status, _, out = apply(node, {**example(), **broken})
    assert status != 0
    for message in ("'entrypoint' must be a boolean, not a string",
                    "${SCRATCH} in 'mounts' is not set in the environment",
                    "hook 'nvidia' takes no annotation 'com.hooks.nvidia.enabel'",
                    "environment 'gone' not found"):
        assert message in out
    assert snapshot(node / "edf") == before


def test_bad_environment_name_fails_before_any_change(node):
    status, _, out = apply(node, {"../escape": {"image": "x"}})
    assert status != 0
    assert "'../escape' is not a usable environment name" in out
    assert not (node / "edf").exists()
