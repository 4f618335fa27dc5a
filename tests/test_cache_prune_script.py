"""roles/container_runtime/templates/berth-cache-prune.sh.j2, rendered by
Ansible and run as root the way berth-cache-prune.service runs it, over a
cache root holding a user's cache and the traps a user may set (issue #11)."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
USER = "bdep-prune-s"
DAY = 86400

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the prune script runs as root")

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Render the prune script
      ansible.builtin.template:
        src: "{{ repo }}/roles/container_runtime/templates/berth-cache-prune.sh.j2"
        dest: "{{ output }}"
        mode: "0755"
"""


@pytest.fixture
def user():
    subprocess.run(["userdel", USER], check=False, capture_output=True)
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                    "/usr/sbin/nologin", USER], check=True, capture_output=True)
    yield pwd.getpwnam(USER)
    subprocess.run(["userdel", USER], check=False, capture_output=True)


@pytest.fixture
def node():
    top = Path(tempfile.mkdtemp(prefix="bdep-prune-script-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top)


def render(node, cache_root):
    """The script for cache_root, with a venv whose berth runs this checkout."""
    venv = node / "venv"
    (venv / "bin").mkdir(parents=True)
    (node / "sysconf").mkdir()
    berth = venv / "bin" / "berth"
    berth.write_text(f"#!/bin/sh\nENROOT_SYSCONF_PATH={node}/sysconf PYTHONPATH={REPO}/runtime "
                     f"exec /usr/bin/python3 -m berth.cli \"$@\"\n")
    berth.chmod(0o755)
    play, output = node / "play.yml", node / "berth-cache-prune"
    play.write_text(PLAY)
    extra = {"repo": str(REPO), "output": str(output), "container_runtime_venv": str(venv),
             "container_runtime_cache_root": str(cache_root),
             "container_runtime_cache_prune_args": ["--older-than", "30"]}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_DEPRECATION_WARNINGS="false", ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    result = subprocess.run(
        [BIN / "ansible-playbook", "-i", "localhost,", "-c", "local", play,
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(extra)],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:]
    return output




def files(directory, names, age_days):
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("x" * 10)
        os.utime(path, (time.time() - age_days * DAY,) * 2)
    return directory


def test_the_script_prunes_each_users_cache_as_that_user(node, user):
    cache_root = node / "cache"
    cache_root.mkdir(mode=0o755)
    layer_old, layer_new = f"{1:064x}", f"{2:064x}"
    mine = cache_root / str(user.pw_uid)
    files(mine / "blobs" / "sha256", [layer_old], 40)
    files(mine / "blobs" / "sha256", [layer_new], 1)
    (mine / "locks").mkdir()
    for path in [mine, *mine.rglob("*")]:
        os.lchown(path, user.pw_uid, user.pw_gid)
    secret = files(node / "secret", ["passwd", f"{3:064x}"], 40)
    secret.chmod(0o700)
    # A user's link in the cache root (only root could put one there, but
    # the script must not care), and root's own directory: both skipped.
    (cache_root / "linked").symlink_to(node)
    (node / "images").symlink_to(secret)
    files(cache_root / "rootdir" / "images", ["old"], 40)
    # A second cache of the user's whose images point at the secret: refused.
    trap = cache_root / "trap"
    (trap / "images").parent.mkdir()
    (trap / "images").symlink_to(secret)
    os.lchown(trap, user.pw_uid, user.pw_gid)
    os.lchown(trap / "images", user.pw_uid, user.pw_gid)
    # The admin's cache root may itself be a link: resolved once, by root.
    (node / "cache-link").symlink_to(cache_root)
    script = render(node, node / "cache-link")
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert result.returncode == 1, result.stderr  # the trap's refusal
    assert result.stderr == f"berth: error: {trap}/images: a symbolic link; berth cache prune " \
                            "follows none in the cache\n"
    assert os.listdir(mine / "blobs" / "sha256") == [layer_new]
    assert f"removed {mine}/blobs/sha256/{layer_old} " in result.stdout
    assert sorted(os.listdir(secret)) == sorted(["passwd", f"{3:064x}"])
    assert os.listdir(cache_root / "rootdir" / "images") == ["old"]
    owners = {path.lstat().st_uid for path in [mine, *mine.rglob("*")]}
    assert owners == {user.pw_uid}


def test_the_script_does_nothing_without_a_cache_root(node):
    script = render(node, node / "missing")
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
