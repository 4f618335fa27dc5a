"""munge_key: binary-safe, idempotent, check mode, and refuses bad keys.

The module is called directly; the first test runs it through ansible-playbook,
as a play runs it."""

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

import ansible_module


def run_module(args, check=False):
    return ansible_module.call_module("munge_key", args, check)


@pytest.fixture
def key_args(tmp_path):
    # Bytes that are not valid UTF-8: a text round trip would corrupt them.
    key = bytes(range(256)) * 4
    owner = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    return key, {"key_b64": base64.b64encode(key).decode(), "path": str(tmp_path / "munge.key"),
                 "owner": owner, "group": group}


@pytest.mark.playbook
def test_installs_binary_key_intact_then_reports_no_change(tmp_path, key_args):
    key, args = key_args
    first = ansible_module.run_module(tmp_path, "munge_key", args)
    assert first["changed"] is True
    path = Path(args["path"])
    assert path.read_bytes() == key
    assert path.stat().st_mode & 0o777 == 0o400
    assert first["size"] == 1024
    assert args["key_b64"] not in json.dumps(first)
    second = ansible_module.run_module(tmp_path, "munge_key", args)
    assert second["changed"] is False


def test_check_mode_reports_change_and_writes_nothing(key_args):
    _, args = key_args
    result = run_module(args, check=True)
    assert result["changed"] is True
    assert not Path(args["path"]).exists()


def test_mode_drift_is_repaired(key_args):
    key, args = key_args
    run_module(args)
    os.chmod(args["path"], 0o644)
    result = run_module(args)
    assert result["changed"] is True
    assert Path(args["path"]).stat().st_mode & 0o777 == 0o400
    assert Path(args["path"]).read_bytes() == key


@pytest.mark.parametrize("size", [16, 2048])
def test_key_of_wrong_size_is_refused_and_nothing_written(key_args, size):
    _, args = key_args
    args["key_b64"] = base64.b64encode(os.urandom(size)).decode()
    result = run_module(args)
    assert result.get("failed") is True
    assert result["msg"] == f"munge_key: key_b64 decodes to {size} bytes; munged needs 32 to 1024 bytes"
    assert not Path(args["path"]).exists()


def test_key_that_is_not_base64_is_refused(key_args):
    _, args = key_args
    args["key_b64"] = "not base64!"
    result = run_module(args)
    assert result.get("failed") is True
    assert result["msg"] == "munge_key: key_b64 is not valid base64"
    assert not Path(args["path"]).exists()
