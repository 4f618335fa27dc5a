"""berth.safedir: the caller's own directories, made private and checked."""

import os
import stat

import pytest

from berth import safedir
from berth.errors import BerthError

AS_ROOT = os.geteuid() == 0


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_ensure_makes_missing_dirs_private(tmp_path):
    target = tmp_path / "a" / "b" / "enroot"
    assert safedir.ensure(str(target), "ENROOT_RUNTIME_PATH") == str(target)
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a/b", target)] == [0o700] * 3
    assert safedir.ensure(str(target), "ENROOT_RUNTIME_PATH") == str(target)  # again: as is


def test_a_sticky_world_writable_parent_is_fine(tmp_path):
    tmp_path.chmod(0o1777)
    safedir.ensure(str(tmp_path / "berth-1"), "ENROOT_RUNTIME_PATH")


def private_group_of_the_caller(monkeypatch, members=()):
    """The caller's primary group as pam_umask's usergroups case sees it: the
    user's name and number; `members`: its listed members."""
    import grp
    import pwd
    uid = os.getuid()
    user = pwd.struct_passwd(("me", "x", uid, uid, "", "/home/me", "/bin/sh"))
    group = grp.struct_group(("me", "x", uid, list(members)))
    monkeypatch.setattr(pwd, "getpwuid", lambda u: user if u == uid else pwd.getpwnam("nobody"))
    monkeypatch.setattr(grp, "getgrgid", lambda g: group if g == uid else grp.getgrnam("nogroup"))


@pytest.mark.parametrize("bits", [0o777, 0o775, 0o757])
def test_a_dir_others_may_write_is_refused(tmp_path, monkeypatch, bits):
    private_group_of_the_caller(monkeypatch, ["mallory"])  # group write is others'
    target = tmp_path / "data"
    target.mkdir()
    target.chmod(bits)
    with pytest.raises(BerthError, match=f"ENROOT_DATA_PATH {target}: is writable by others"):
        safedir.check_if_present(str(target), "ENROOT_DATA_PATH")


def test_group_write_by_the_callers_private_group_is_fine(tmp_path, monkeypatch):
    # Debian 13's umask 002: a user's own ~/.config is 0775, group = user.
    private_group_of_the_caller(monkeypatch)
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    os.chown(home / ".config", os.getuid(), os.getuid())
    (home / ".config").chmod(0o775)
    safedir.ensure(str(home / ".config/enroot"), "ENROOT_CONFIG_PATH")
    (home / ".config/enroot").chmod(0o775)
    safedir.check(str(home / ".config/enroot"), "ENROOT_CONFIG_PATH")


@pytest.mark.parametrize("members", [["mallory"], ["me", "mallory"]])
def test_group_write_by_a_private_group_with_other_members_is_refused(tmp_path, monkeypatch,
                                                                         members):
    private_group_of_the_caller(monkeypatch, members)
    config = tmp_path / ".config"
    config.mkdir()
    os.chown(config, os.getuid(), os.getuid())
    config.chmod(0o775)
    with pytest.raises(BerthError, match="is writable by others"):
        safedir.check(str(config), "ENROOT_CONFIG_PATH")
    with pytest.raises(BerthError, match=f"its parent {config} lets others replace it"):
        safedir.ensure(str(config / "enroot"), "ENROOT_CONFIG_PATH")
    assert list(config.iterdir()) == []


@pytest.mark.skipif(not AS_ROOT, reason="gives a directory another group")
def test_group_write_by_another_group_is_refused(tmp_path, monkeypatch):
    private_group_of_the_caller(monkeypatch)
    config = tmp_path / ".config"
    config.mkdir()
    os.chown(config, os.getuid(), 65534)
    config.chmod(0o775)
    with pytest.raises(BerthError, match=r"is writable by others \(mode 0775\)"):
        safedir.check(str(config), "ENROOT_CONFIG_PATH")


def test_a_parent_others_may_write_is_refused_before_anything_is_made(tmp_path):
    tmp_path.chmod(0o777)
    with pytest.raises(BerthError, match=f"its parent {tmp_path} lets others replace it"):
        safedir.ensure(str(tmp_path / "enroot"), "ENROOT_RUNTIME_PATH")
    assert list(tmp_path.iterdir()) == []


def test_missing_is_fine_for_a_dir_only_read(tmp_path):
    assert safedir.check_if_present(str(tmp_path / "nope"), "ENROOT_CONFIG_PATH") is None


def test_not_a_directory_and_dangling_links_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BerthError, match="is not a directory"):
        safedir.check_if_present(str(tmp_path / "file"), "ENROOT_DATA_PATH")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(BerthError, match="dangling symlink"):
        safedir.check_if_present(str(tmp_path / "dangling"), "ENROOT_DATA_PATH")


def test_the_callers_own_symlink_is_followed(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    safedir.check(str(tmp_path / "link"), "ENROOT_DATA_PATH")


@pytest.mark.skipif(not AS_ROOT, reason="plays another user")
def test_another_users_dir_or_symlink_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(BerthError, match="owned by uid 65534, not by you"):
        safedir.check(str(theirs), "ENROOT_DATA_PATH")
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "planted").symlink_to(tmp_path / "mine")
    os.lchown(tmp_path / "planted", 65534, 65534)
    with pytest.raises(BerthError, match="is a symlink owned by uid 65534"):
        safedir.check(str(tmp_path / "planted"), "ENROOT_DATA_PATH")
    with pytest.raises(BerthError, match="its parent .*planted is a symlink owned by uid 65534"):
        safedir.ensure(str(tmp_path / "planted" / "enroot"), "ENROOT_RUNTIME_PATH")
    assert list((tmp_path / "mine").iterdir()) == []
