"""library/berth_venv.py: a real venv from Debian's python3, made through
ansible-playbook; the refusals called directly."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import ansible_module

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs /usr/bin/python3")


def run_module(tmp_path, module_args, check=False, umask=0o022):
    """Run berth_venv once under `umask`; return its registered result."""
    return ansible_module.run_module(tmp_path, "berth_venv", module_args, check, umask)


def call_module(module_args, check=False):
    return ansible_module.call_module("berth_venv", module_args, check)


def runtime_copy(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "runtime", src, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    return src


def berth_version(venv, tmp_path):
    out = subprocess.run(
        [str(venv / "bin" / "berth"), "version"], check=True, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ENROOT_SYSCONF_PATH": str(tmp_path)},
    )
    return out.stdout.strip()


@pytest.mark.playbook
def test_installs_once_and_again_only_when_the_source_changes(tmp_path):
    src = runtime_copy(tmp_path)
    venv = tmp_path / "venv"
    args = {"src": str(src), "venv": str(venv), "python": SYSTEM_PYTHON}
    files_before = sorted(p.relative_to(src) for p in src.rglob("*"))

    first = run_module(tmp_path, args, umask=0o077)  # a hardened root's umask
    assert first["changed"] is True
    [package] = venv.glob("lib/python3*/site-packages/berth")
    assert (venv / "bin" / "berth").stat().st_mode & 0o005 == 0o005
    assert package.stat().st_mode & 0o005 == 0o005
    assert (package / "cli.py").stat().st_mode & 0o004
    assert (venv / ".source-sha256").read_text().strip() == first["sha256"]
    assert berth_version(venv, tmp_path) == "0.1.0"
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == files_before

    assert run_module(tmp_path, args)["changed"] is False

    init = src / "berth" / "__init__.py"
    init.write_text(init.read_text().replace('"0.1.0"', '"0.1.1"'))
    planned = run_module(tmp_path, args, check=True)
    assert planned["changed"] is True
    assert planned["previous_sha256"] == first["sha256"]
    assert berth_version(venv, tmp_path) == "0.1.0"

    updated = run_module(tmp_path, args)
    assert updated["changed"] is True
    assert berth_version(venv, tmp_path) == "0.1.1"


def test_source_without_pyproject_fails_naming_src_and_creates_nothing(tmp_path):
    venv = tmp_path / "venv"
    result = call_module({"src": str(tmp_path), "venv": str(venv), "python": SYSTEM_PYTHON})
    assert result["failed"] is True
    assert result["msg"] == f"src: {tmp_path} has no pyproject.toml"
    assert not venv.exists()


def test_check_mode_with_the_source_not_yet_copied_plans_an_install(tmp_path):
    venv = tmp_path / "venv"
    args = {"src": str(tmp_path / "not-copied-yet"), "venv": str(venv), "python": SYSTEM_PYTHON}
    assert call_module(args, check=True)["changed"] is True
    assert not venv.exists()
    assert call_module(args)["msg"] == f"src: {tmp_path}/not-copied-yet has no pyproject.toml"


def test_missing_interpreter_fails_naming_it_and_creates_nothing(tmp_path):
    venv = tmp_path / "venv"
    args = {"src": str(runtime_copy(tmp_path)), "venv": str(venv), "python": "/nonexistent/python3"}
    assert call_module(args)["msg"] == "python: /nonexistent/python3 is not an executable"
    assert not venv.exists()
