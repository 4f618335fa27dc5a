"""The unit tier (conftest.py, pytest.ini) holds only tests that pass as an
ordinary user, offline, without ansible-playbook."""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import ansible_module

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.root
def test_the_unit_tier_passes_as_an_ordinary_user_without_a_network():
    """A test that needs root or the network and is not marked for it fails
    (or is skipped) here: mark it in conftest.py."""
    nobody = pwd.getpwnam("nobody")
    home = Path(tempfile.mkdtemp(prefix="berth-unit-tier-"))
    try:
        # a copy of the checkout, which may lie where nobody cannot read
        shutil.copytree(REPO, home / "repo", ignore=shutil.ignore_patterns(
            ".git", ".cache", "__pycache__", ".pytest_cache", ".hypothesis"))
        for path in (home, *home.rglob("*")):
            os.lchown(path, nobody.pw_uid, nobody.pw_gid)
        done = subprocess.run(
            ["unshare", "--net", "setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
             "--clear-groups", sys.executable, "-m", "pytest", "-m", "unit", "-q", "-rs",
             "-p", "no:cacheprovider", "--basetemp", f"{home}/tmp", "tests", "runtime/tests"],
            cwd=home / "repo", capture_output=True, text=True,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"})
    finally:
        shutil.rmtree(home)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, done.stdout[-4000:]


def test_a_unit_test_cannot_start_ansible_playbook(tmp_path):
    with pytest.raises(AssertionError, match="a unit-tier test runs ansible-playbook"):
        ansible_module.run_module(tmp_path, "enroot_conf", {"settings": {}})
