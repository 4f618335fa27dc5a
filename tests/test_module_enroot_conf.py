"""library/enroot_conf.py: called directly, and once through ansible-playbook
as a site would run it."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import ansible_module

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from berth import config  # noqa: E402


def run_module(module_args, check=False):
    """Run enroot_conf once; return its result."""
    return ansible_module.call_module("enroot_conf", module_args, check)


def node_settings(conf):
    return {
        "path": str(conf),
        "mode": "0644",
        "settings": {
            "ENROOT_DATA_PATH": "/var/lib/berth/data/${UID}",
            "ENROOT_SQUASH_OPTIONS": "-comp zstd -Xcompression-level 3",
            "ENROOT_ALLOW_HTTP": False,
            "ENROOT_MOUNT_HOME": "Y",
            "ENROOT_MAX_CONNECTIONS": "4",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        },
    }


def test_keys_match_the_runtime():
    spec = importlib.util.spec_from_file_location(
        "berth_enroot_keys", REPO / "plugins" / "module_utils" / "berth_enroot_keys.py")
    keys = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keys)
    assert set(keys.KEYS) == set(config.KEYS)
    assert keys.HOOK_VARIABLE_PREFIXES == config.HOOK_VARIABLE_PREFIXES
    assert keys.RANGES == config.RANGES
    assert set(keys.RANGES) == {key for key, kind in keys.KEYS.items() if kind == keys.COUNT}


@pytest.mark.playbook
def test_writes_a_file_the_runtime_reads_and_second_run_changes_nothing(tmp_path):
    conf = tmp_path / "enroot.conf"
    first = ansible_module.run_module(tmp_path, "enroot_conf", node_settings(conf))
    assert first["changed"] is True
    assert oct(conf.stat().st_mode & 0o777) == "0o644"
    assert "ENROOT_ALLOW_HTTP no\n" in conf.read_text()
    assert "ENROOT_MOUNT_HOME yes\n" in conf.read_text()

    cfg = config.load({"ENROOT_SYSCONF_PATH": str(tmp_path), "HOME": "/home/u"})
    assert cfg["ENROOT_DATA_PATH"] == f"/var/lib/berth/data/{os.getuid()}"
    assert cfg["ENROOT_SQUASH_OPTIONS"] == "-comp zstd -Xcompression-level 3"
    assert cfg.flag("ENROOT_ALLOW_HTTP") is False
    assert cfg.number("ENROOT_MAX_CONNECTIONS") == 4
    assert cfg["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # a hooks' variable

    second = ansible_module.run_module(tmp_path, "enroot_conf", node_settings(conf))
    assert second["changed"] is False


def test_check_mode_reports_the_diff_and_writes_nothing(tmp_path):
    conf = tmp_path / "enroot.conf"
    conf.write_text("ENROOT_ALLOW_HTTP yes\n")
    result = run_module(node_settings(conf), check=True)
    assert result["changed"] is True
    assert result["diff"]["before"] == "ENROOT_ALLOW_HTTP yes\n"
    assert "ENROOT_ALLOW_HTTP no\n" in result["diff"]["after"]
    assert conf.read_text() == "ENROOT_ALLOW_HTTP yes\n"


@pytest.mark.parametrize("key, value, message", [
    ("ENROOT_DATAPATH", "/x", "unknown enroot.conf key 'ENROOT_DATAPATH'"),
    ("ENROOT_ALLOW_HTTP", "maybe", "ENROOT_ALLOW_HTTP: expected yes or no"),
    ("ENROOT_MAX_CONNECTIONS", "ten", "ENROOT_MAX_CONNECTIONS: expected a whole number"),
    ("ENROOT_MAX_CONNECTIONS", "99999999999999999999",
     "ENROOT_MAX_CONNECTIONS: expected a whole number from 1 to 256"),
    ("ENROOT_CONNECT_TIMEOUT", "10000000000", "ENROOT_CONNECT_TIMEOUT: expected a whole number from 0 to 86400"),
    ("ENROOT_DATA_PATH", "data/${UID}", "ENROOT_DATA_PATH: expected an absolute path"),
    ("NVIDIA_VISIBLE-DEVICES", "all", "unknown enroot.conf key 'NVIDIA_VISIBLE-DEVICES'"),
    ("NVIDIA_VISIBLE_DEVICES", "", "NVIDIA_VISIBLE_DEVICES: value must be one non-empty line"),
    ("ENROOT_SQUASH_OPTIONS", "-comp zstd # fast", "ENROOT_SQUASH_OPTIONS: value must be one non-empty line"),
])
def test_bad_setting_fails_naming_the_key_and_keeps_the_file(tmp_path, key, value, message):
    conf = tmp_path / "enroot.conf"
    conf.write_text("ENROOT_ALLOW_HTTP yes\n")
    args = node_settings(conf)
    args["settings"][key] = value
    result = run_module(args)
    assert result["failed"] is True
    assert message in result["msg"]
    assert conf.read_text() == "ENROOT_ALLOW_HTTP yes\n"


def test_missing_directory_fails_naming_it_but_check_mode_plans_the_file(tmp_path):
    conf = tmp_path / "etc" / "enroot" / "enroot.conf"
    planned = run_module(node_settings(conf), check=True)
    assert planned["changed"] is True
    assert planned["diff"]["before"] == ""
    failed = run_module(node_settings(conf))
    assert failed["msg"] == f"{conf}: directory {conf.parent} does not exist"
    assert not conf.parent.exists()


def test_the_roles_retries_all_fit_within_the_default_transfer_timeout():
    """The count the role's enroot.conf sets: its longest waits (1, 2, 4, 8
    and 16 s) end within the runtime's default transfer timeout, so that
    no retry it allows is cut by the time bound."""
    import yaml
    roles_vars = yaml.safe_load((REPO / "roles/container_runtime/vars/main.yml").read_text())
    count = roles_vars["container_runtime_enroot_conf_base"]["ENROOT_TRANSFER_RETRIES"]
    assert count == 5
    default = int(config._defaults(dict(os.environ))["ENROOT_TRANSFER_TIMEOUT"])
    assert sum(2 ** n for n in range(count)) < default


def test_a_sites_shell_values_are_kept_as_written_and_read_as_enroot_reads_them(tmp_path):
    """The values of pyxis's setup guide and of enroot's own file: the
    module writes them as the site had them, not quoted nor expanded, a
    second run changes nothing, and the runtime reads them."""
    conf = tmp_path / "enroot.conf"
    shell = {
        "ENROOT_RUNTIME_PATH": "/run/enroot/user-$(id -u)",
        "ENROOT_CACHE_PATH": "/raid/enroot-cache/group-$(id -g)",
        "ENROOT_DATA_PATH": "~/.local/share/enroot",
        "ENROOT_TEMP_PATH": "${TMPDIR:-/tmp}",
        "ENROOT_MAX_PROCESSORS": "$(nproc)",
    }
    args = {"path": str(conf), "settings": shell}
    assert run_module(args)["changed"] is True
    lines = conf.read_text().splitlines()[1:]
    assert lines == [f"{key} {value}" for key, value in sorted(shell.items())]
    assert run_module(args)["changed"] is False

    cfg = config.load({"ENROOT_SYSCONF_PATH": str(tmp_path), "HOME": "/home/u"})
    assert cfg["ENROOT_RUNTIME_PATH"] == f"/run/enroot/user-{os.geteuid()}"
    assert cfg["ENROOT_CACHE_PATH"] == f"/raid/enroot-cache/group-{os.getegid()}"
    assert cfg["ENROOT_DATA_PATH"] == "/home/u/.local/share/enroot"
    assert cfg["ENROOT_TEMP_PATH"] == "/tmp"
    assert cfg.number("ENROOT_MAX_PROCESSORS") == len(os.sched_getaffinity(0))
