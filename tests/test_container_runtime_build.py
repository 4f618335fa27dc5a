"""roles/container_runtime's berth build packages (tasks/build.yml): real
wheels from PyPI installed into a real venv by ansible-playbook on localhost,
offline from a wheel directory or through the controller's download cache."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import ansible_module

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"
PINS = {p["name"]: p["version"] for p in
        yaml.safe_load((REPO / "roles/container_runtime/vars/main.yml").read_text())
        ["container_runtime_build_packages"]}
PLAY = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
    "name": "Install or remove berth build's packages",
    "ansible.builtin.include_role": {"name": "container_runtime", "tasks_from": "build.yml"}}]}]


def test_the_role_pins_what_requirements_dev_and_the_build_extra_allow():
    dev = dict(line.split("==") for line in (REPO / "requirements-dev.txt").read_text().splitlines()
               if "==" in line and not line.startswith("#"))
    assert {name: dev.get(name) for name in PINS} == PINS
    extra = tomllib.loads((REPO / "runtime/pyproject.toml").read_text())["project"]["optional-dependencies"]["build"]
    allowed = {r.name: r.specifier for r in map(Requirement, extra)}
    assert sorted(allowed) == sorted(PINS)
    assert all(allowed[name].contains(version) for name, version in PINS.items())


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """The pinned wheels, downloaded once from PyPI."""
    directory = tmp_path_factory.mktemp("hwheel-wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
                    "--dest", str(directory), *(f"{n}=={v}" for n, v in PINS.items())],
                   check=True, capture_output=True)
    return directory


@pytest.fixture
def venv(tmp_path):
    path = tmp_path / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(path)], check=True)
    return path


def apply(tmp_path, venv, check=False, **variables):
    """Run build.yml; return (exit status, changed count, output)."""
    playbook = [dict(PLAY[0], check_mode=check)]
    status, out = ansible_module.run_playbook(tmp_path, playbook, {
        "container_runtime_venv": str(venv), "container_runtime_python": SYSTEM_PYTHON,
        "container_runtime_build_wheel_dir": "",
        "container_runtime_build_wheel_cache": str(tmp_path / "cache"), **variables},
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), HOME=str(tmp_path))
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", out)
    return status, int(recap.group(1)) if recap else None, out


def installed(venv):
    """The versions of the pinned packages the venv's python imports."""
    script = ("import importlib.metadata as m, json, dockerfile, e2b_dockerfile_utils;"
              f"print(json.dumps({{n: m.version(n) for n in {sorted(PINS)!r}}}))")
    done = subprocess.run([str(venv / "bin/python"), "-c", script], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


@pytest.mark.playbook
def test_offline_from_the_wheel_directory_checks_installs_once_and_turns_off(tmp_path, venv, wheels):
    offline = {"container_runtime_build_wheel_dir": str(wheels)}
    status, changed, out = apply(tmp_path, venv, check=True, **offline)
    assert status == 0 and changed >= 1, out
    assert installed(venv) is None and not (venv / "wheels").exists()

    status, changed, out = apply(tmp_path, venv, **offline)
    assert status == 0 and changed >= 1, out
    assert installed(venv) == PINS
    assert not (tmp_path / "cache").exists()  # nothing downloaded
    status, changed, out = apply(tmp_path, venv, **offline)
    assert status == 0 and changed == 0, out

    status, changed, out = apply(tmp_path, venv, container_runtime_build=False)
    assert status == 0 and changed == 2, out
    assert installed(venv) is None and not (venv / "wheels").exists()


@pytest.mark.playbook
def test_a_wheel_missing_from_the_directory_fails_naming_it_and_installs_nothing(tmp_path, venv, wheels):
    partial = tmp_path / "partial"
    partial.mkdir()
    for wheel in wheels.glob("dockerfile-*.whl"):
        (partial / wheel.name).write_bytes(wheel.read_bytes())
    status, _, out = apply(tmp_path, venv, container_runtime_build_wheel_dir=str(partial))
    assert status != 0
    assert (f"e2b-dockerfile-utils==0.1.1: container_runtime_build_wheel_dir {partial} has no wheel of it"
            in out), out
    assert installed(venv) is None and not (venv / "wheels").exists()


@pytest.mark.playbook
def test_the_controller_downloads_into_its_cache_once(tmp_path, venv):
    status, changed, out = apply(tmp_path, venv)
    assert status == 0 and changed >= 1, out
    assert installed(venv) == PINS
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.whl"))
    assert len(cached) == 2 and cached[0].startswith("dockerfile-3.4.0-"), cached
    status, changed, out = apply(tmp_path, venv)
    assert status == 0 and changed == 0, out


@pytest.mark.playbook
def test_a_wheel_pypi_lacks_fails_in_one_line_naming_it_and_caches_nothing(tmp_path):
    cache = tmp_path / "cache"
    result = ansible_module.run_module(tmp_path, "berth_wheel_fetch", {
        "packages": [{"name": "dockerfile", "version": "0.0.0", "python": "3.9"}],
        "python_version": "3.11", "machine": "x86_64", "glibc": "2.36", "cache": str(cache)})
    assert result["failed"] is True
    assert "\n" not in result["msg"]
    assert result["msg"].startswith("dockerfile==0.0.0: cannot download its wheel for CPython 3.11 "
                                    "on x86_64 ("), result["msg"]
    assert result["msg"].endswith("or set container_runtime_build: false")
    assert list(cache.rglob("*")) == [cache / "cp311-manylinux_2_36_x86_64"]
