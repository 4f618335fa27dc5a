"""library/berth_set_aside.py: a site's files moved or copied aside under a
manifest, and put back byte for byte (the adopt role's way there and back)."""

import json
import os
import subprocess

import pytest

from ansible_module import call_module, run_module


@pytest.fixture
def site(tmp_path):
    """A node's files: pyxis's plugstack line, an enroot.conf, an enroot link."""
    (tmp_path / "etc").mkdir()
    pyxis = tmp_path / "etc/pyxis.conf"
    pyxis.write_bytes(b"required /usr/local/lib/slurm/spank_pyxis.so\n\x00odd bytes\n")
    pyxis.chmod(0o640)
    conf = tmp_path / "etc/enroot.conf"
    conf.write_text("ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n")
    os.symlink("/opt/enroot/bin/enroot", tmp_path / "etc/enroot")
    return tmp_path


def args(site, **more):
    return dict(manifest=str(site / "state/manifest.json"), **more)


def set_aside(site, check=False):
    return call_module("berth_set_aside", args(
        site, move=[str(site / "etc/pyxis.conf"), str(site / "etc/enroot"), str(site / "etc/missing")],
        keep=[str(site / "etc/enroot.conf"), str(site / "etc/berth.conf")]), check=check)


def test_moves_and_keeps_with_a_manifest_of_checksums(site):
    done = set_aside(site)
    assert done["changed"] and not done["failed"], done
    assert sorted(done["moved"]) == [str(site / "etc/enroot"), str(site / "etc/pyxis.conf")]
    assert not (site / "etc/pyxis.conf").exists() and not os.path.lexists(site / "etc/enroot")
    assert (site / "etc/enroot.conf").exists()
    entries = {e["path"]: e for e in json.loads((site / "state/manifest.json").read_text())["entries"]}
    assert entries[str(site / "etc/berth.conf")]["action"] == "absent"
    assert entries[str(site / "etc/enroot")]["link"] == "/opt/enroot/bin/enroot"
    pyxis = entries[str(site / "etc/pyxis.conf")]
    assert pyxis["mode"] == 0o640 and len(pyxis["sha256"]) == 64
    assert open(pyxis["stored"], "rb").read().endswith(b"\x00odd bytes\n")
    assert str(site / "etc/missing") not in entries
    assert (site / "state").stat().st_mode & 0o777 == 0o700


def test_check_mode_says_what_it_would_do_and_touches_nothing(site):
    done = set_aside(site, check=True)
    assert done["changed"] and str(site / "etc/pyxis.conf") in done["moved"]
    assert (site / "etc/pyxis.conf").exists() and not (site / "state").exists()


def test_a_second_run_keeps_the_first_record(site):
    before = (site / "etc/enroot.conf").read_bytes()
    set_aside(site)
    (site / "etc/enroot.conf").write_text("rewritten by a later task\n")
    (site / "etc/pyxis.conf").write_text("a package put it back\n")
    again = set_aside(site)
    assert not again["changed"], again
    back = call_module("berth_set_aside", args(site, state="restored"))
    assert back["changed"] and not back["failed"], back
    assert (site / "etc/enroot.conf").read_bytes() == before


def test_restores_every_file_byte_for_byte_and_removes_what_was_absent(site):
    originals = {p: (site / p).read_bytes() for p in ("etc/pyxis.conf", "etc/enroot.conf")}
    set_aside(site)
    (site / "etc/enroot.conf").write_text("ENROOT_RUNTIME_PATH /run/berth/${UID}\n")
    (site / "etc/berth.conf").write_text("required spank_berth.so\n")
    os.symlink("/opt/berth/bin/berth", site / "etc/enroot")
    back = call_module("berth_set_aside", args(site, state="restored"))
    assert not back["failed"], back
    assert back["removed"] == [str(site / "etc/berth.conf")]
    for path, content in originals.items():
        assert (site / path).read_bytes() == content
    assert (site / "etc/pyxis.conf").stat().st_mode & 0o777 == 0o640
    assert os.readlink(site / "etc/enroot") == "/opt/enroot/bin/enroot"
    assert not (site / "etc/berth.conf").exists()
    assert not (site / "state/manifest.json").exists() and not (site / "state/files").exists()
    assert not call_module("berth_set_aside", args(site, state="restored"))["changed"]


def test_a_changed_stored_copy_stops_the_restore_before_any_change(site):
    set_aside(site)
    (site / "etc/enroot.conf").write_text("Berth's\n")
    entries = json.loads((site / "state/manifest.json").read_text())["entries"]
    stored = next(e["stored"] for e in entries if e["path"].endswith("pyxis.conf"))
    with open(stored, "ab") as f:
        f.write(b"tampered\n")
    back = call_module("berth_set_aside", args(site, state="restored"))
    assert back["failed"] and "pyxis.conf" in back["msg"] and "nothing was restored" in back["msg"], back
    assert len(back["msg"].splitlines()) == 1
    assert (site / "etc/enroot.conf").read_text() == "Berth's\n"
    assert not (site / "etc/pyxis.conf").exists()


def test_refuses_a_directory_another_user_could_write(site):
    """The hostile user: a directory anyone can write could swap the file
    between the check and the move, so nothing in it is touched."""
    shared = site / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "pyxis.conf").write_text("x\n")
    done = call_module("berth_set_aside", args(site, move=[str(shared / "pyxis.conf")]))
    assert done["failed"] and f"{shared}: owned or writable by another user" in done["msg"], done
    assert (shared / "pyxis.conf").exists() and not (site / "state").exists()


def test_refuses_a_relative_path(site):
    done = call_module("berth_set_aside", args(site, keep=["etc/enroot.conf"]))
    assert done["failed"] and done["msg"] == "berth_set_aside: etc/enroot.conf: not an absolute path"


@pytest.mark.playbook
def test_through_ansible_playbook_and_again_unchanged(site, tmp_path):
    module_args = args(site, move=[str(site / "etc/pyxis.conf")], keep=[str(site / "etc/enroot.conf")])
    first = run_module(tmp_path, "berth_set_aside", module_args)
    assert first["changed"] and not first.get("failed"), first
    again = run_module(tmp_path, "berth_set_aside", module_args)
    assert not again["changed"], again


@pytest.mark.root
def test_a_file_capability_and_owner_come_back(site):
    """enroot's enroot-aufs2ovlfs carries cap_sys_admin,cap_mknod+pe: moved
    aside and back, it must still start containers."""
    helper = site / "etc/enroot-aufs2ovlfs"
    helper.write_bytes(b"\x7fELF pretend\n")
    os.chown(helper, 0, 65534)
    subprocess.run(["setcap", "cap_sys_admin,cap_mknod+pe", str(helper)], check=True)
    before = subprocess.run(["getcap", str(helper)], capture_output=True, text=True, check=True).stdout
    call_module("berth_set_aside", args(site, move=[str(helper)]))
    assert not helper.exists()
    back = call_module("berth_set_aside", args(site, state="restored"))
    assert back["moved"] == [str(helper)], back
    assert subprocess.run(["getcap", str(helper)], capture_output=True, text=True).stdout == before
    assert "cap_mknod" in before and helper.stat().st_gid == 65534
