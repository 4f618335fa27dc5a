"""library/berth_spank.py: real builds of spank_berth.so.

The installed Slurm is played by a script that prints `slurm VERSION`, and the
headers by a copy of /usr/include/slurm whose version can be changed, so
version changes and mismatches can be shown on one machine."""

import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SLURM_HEADERS = Path("/usr/include/slurm")

pytestmark = pytest.mark.skipif(not (SLURM_HEADERS / "spank.h").exists(),
                                reason="needs Slurm headers (libslurm-dev)")


def run_module(tmp_path, module_args, check=False):
    """Run the module the way Ansible does, minus the playbook start-up time."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        **module_args, "_ansible_check_mode": check, "_ansible_diff": check}}))
    result = subprocess.run([sys.executable, str(REPO / "library" / "berth_spank.py"), str(args)],
                            capture_output=True, text=True)
    return json.loads(result.stdout)


class FakeSlurm:
    """Headers and an installed Slurm whose versions the test sets."""

    def __init__(self, tmp_path):
        self.include = tmp_path / "include"
        shutil.copytree(SLURM_HEADERS, self.include / "slurm")
        self.binary = tmp_path / "slurmd"
        number = int(re.search(r"SLURM_VERSION_NUMBER\s+0x(\w+)",
                                (SLURM_HEADERS / "slurm_version.h").read_text()).group(1), 16)
        self.real = f"{number >> 16}.{(number >> 8) & 0xff:02d}.{number & 0xff}"
        self.set(headers=self.real, installed=self.real)

    def set(self, headers, installed):
        """Headers say `headers` (MAJOR.MINOR.MICRO), `slurmd -V` says `installed`."""
        major, minor, micro = (int(x) for x in headers.split("."))
        h = self.include / "slurm" / "slurm_version.h"
        text = re.sub(r"(#define SLURM_VERSION_NUMBER\s+)0x[0-9a-fA-F]+",
                      rf"\g<1>0x{major:02x}{minor:02x}{micro:02x}", h.read_text())
        h.write_text(text)
        self.binary.write_text(f"#!/bin/sh\necho 'slurm {installed}'\n")
        self.binary.chmod(0o755)


@pytest.fixture()
def setup(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "spank", src, ignore=shutil.ignore_patterns("tests"))
    slurm = FakeSlurm(tmp_path)
    dest = tmp_path / "plugins" / "spank_berth.so"
    args = {"src": str(src), "dest": str(dest), "slurm_include": str(slurm.include),
            "slurm_binary": str(slurm.binary)}
    return src, slurm, dest, args


def test_builds_once_then_only_when_source_or_slurm_changes(tmp_path, setup):
    src, slurm, dest, args = setup
    files_before = sorted(p.relative_to(src) for p in src.rglob("*"))

    first = run_module(tmp_path, args)
    assert first["changed"] is True, first
    assert first["rebuilt_because"] == f"{dest} is missing"
    assert oct(dest.stat().st_mode & 0o777) == "0o755"
    stamp = json.loads(Path(f"{dest}.stamp").read_text())
    assert stamp["slurm_version"] == slurm.real
    assert stamp["source_sha256"] == first["source_sha256"]
    assert b"spank_berth" in dest.read_bytes()
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == files_before
    mtime = dest.stat().st_mtime_ns

    again = run_module(tmp_path, args)
    assert again["changed"] is False, again
    assert dest.stat().st_mtime_ns == mtime

    # a Slurm upgrade (headers and daemons together) rebuilds
    major, minor, micro = slurm.real.split(".")
    upgraded = f"{major}.{minor}.{int(micro) + 1}"
    slurm.set(headers=upgraded, installed=upgraded)
    bumped = run_module(tmp_path, args)
    assert bumped["changed"] is True
    assert bumped["rebuilt_because"] == f"slurm version {slurm.real} -> {upgraded}"
    assert json.loads(Path(f"{dest}.stamp").read_text())["slurm_version"] == upgraded

    # so does a change in the sources
    (src / "spank_berth.c").write_text((src / "spank_berth.c").read_text() + "\n/* edit */\n")
    edited = run_module(tmp_path, args)
    assert edited["changed"] is True and edited["rebuilt_because"] == "plugin sources changed"
    assert run_module(tmp_path, args)["changed"] is False

    # and a plugin replaced behind the module's back
    dest.write_bytes(b"not the plugin")
    assert run_module(tmp_path, args)["rebuilt_because"].endswith("not the plugin recorded in its stamp")
    assert b"spank_berth" in dest.read_bytes()


def test_check_mode_reports_without_building(tmp_path, setup):
    _, _, dest, args = setup
    result = run_module(tmp_path, args, check=True)
    assert result["changed"] is True
    assert "slurm_version" in result["diff"]["after"]
    assert not dest.exists() and not Path(f"{dest}.stamp").exists()


def test_version_mismatch_fails_naming_both_versions(tmp_path, setup):
    _, slurm, dest, args = setup
    slurm.set(headers="23.02.7", installed=slurm.real)
    result = run_module(tmp_path, args)
    assert result["failed"] is True
    assert "version 23.02.7" in result["msg"] and f"version {slurm.real}" in result["msg"]
    assert not dest.exists()


def test_missing_sources_are_named(tmp_path, setup):
    src, _, dest, args = setup
    (src / "plugstack.c").unlink()
    result = run_module(tmp_path, args)
    assert result["failed"] is True
    assert result["msg"] == f"src: {src} lacks plugstack.c"
    assert not dest.exists()


def test_a_missing_source_list_is_named(tmp_path, setup):
    src, _, dest, args = setup
    (src / "sources.txt").unlink()
    result = run_module(tmp_path, args)
    assert result["failed"] is True
    assert result["msg"] == f"src: {src} lacks sources.txt"
    assert not dest.exists()


def test_compile_error_leaves_the_installed_plugin_alone(tmp_path, setup):
    src, _, dest, args = setup
    assert run_module(tmp_path, args)["changed"] is True
    installed = dest.read_bytes()
    stamp = Path(f"{dest}.stamp").read_text()
    (src / "plugstack.c").write_text((src / "plugstack.c").read_text() + "\nint broken(void) { return }\n")
    result = run_module(tmp_path, args)
    assert result["failed"] is True
    assert "building spank_berth.so failed" in result["msg"] and "plugstack.c" in result["msg"]
    assert dest.read_bytes() == installed
    assert Path(f"{dest}.stamp").read_text() == stamp


def test_bad_slurm_binary_is_named(tmp_path, setup):
    _, slurm, _, args = setup
    slurm.binary.write_text("#!/bin/sh\necho 'something else'\n")
    result = run_module(tmp_path, args)
    assert result["failed"] is True
    assert f"slurm_binary: '{slurm.binary} -V' did not name a Slurm version" in result["msg"]



def load_module():
    spec = importlib.util.spec_from_file_location("berth_spank", REPO / "library" / "berth_spank.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(monkeypatch, capsys, module_args):
    """main() in this process, so that the test can watch its system calls."""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": module_args}).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)  # as a module run from a file
    capsys.readouterr()
    with pytest.raises(SystemExit):
        load_module().main()
    return json.loads(capsys.readouterr().out)


def path_of(fd):
    return os.readlink(f"/proc/self/fd/{fd}")


def test_the_new_plugin_is_synced_to_disk_before_it_replaces_the_old(tmp_path, setup, monkeypatch, capsys):
    """Without the sync, a crash after the rename can leave a plugin file of
    the right name and no content: every step on that node would fail."""
    src, _, dest, args = setup
    assert run_module(tmp_path, args)["changed"] is True
    (src / "spank_berth.c").write_text((src / "spank_berth.c").read_text() + "\n/* edit */\n")
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", path_of(fd))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))),
                                                      real_replace(a, b))[1])
    result = run_in_process(monkeypatch, capsys, args)
    assert result["changed"] is True and result["rebuilt_because"] == "plugin sources changed", result
    staged = f"{dest}.new"
    replace = events.index(("replace", staged, str(dest)))
    assert ("fsync", staged) in events[:replace], events
    assert ("fsync", str(dest.parent)) in events[replace:], events
    assert not Path(staged).exists()


def test_a_failed_install_leaves_the_plugin_and_its_stamp(tmp_path, setup, monkeypatch, capsys):
    src, _, dest, args = setup
    assert run_module(tmp_path, args)["changed"] is True
    installed = dest.read_bytes()
    stamp = Path(f"{dest}.stamp").read_text()
    (src / "spank_berth.c").write_text((src / "spank_berth.c").read_text() + "\n/* edit */\n")
    real_fsync = os.fsync

    def disk_full(fd):
        if path_of(fd).endswith(".so.new"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full)
    result = run_in_process(monkeypatch, capsys, args)
    assert result["failed"] is True
    assert result["msg"] == (f"installing {dest} failed: [Errno {errno.ENOSPC}] No space left on device; "
                             "the plugin in place is unchanged")
    assert dest.read_bytes() == installed
    assert Path(f"{dest}.stamp").read_text() == stamp
    assert not Path(f"{dest}.new").exists()
    # and the next run, with the disk back, builds it
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert run_module(tmp_path, args)["rebuilt_because"] == "plugin sources changed"
