"""`berth setup-user`: per-user runtime directories made by root for one user."""

import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from berth import cli, userdirs  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="setup-user runs as root")
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def shared_root():
    """A root-owned 0755 directory every user can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="bdep-userdirs-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def configure(monkeypatch, root, **settings):
    sysconf = root / "sysconf"
    sysconf.mkdir()
    (sysconf / "enroot.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    monkeypatch.setenv("ENROOT_SYSCONF_PATH", str(sysconf))


def node_layout(root):
    for shared in ("cache", "data", "run"):
        (root / shared).mkdir(mode=0o755)
    return {
        "ENROOT_CACHE_PATH": f"{root}/cache/${{UID}}",
        "ENROOT_DATA_PATH": f"{root}/data/${{USER}}",
        "ENROOT_RUNTIME_PATH": f"{root}/run/${{UID}}",
    }


def owner_and_mode(path):
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@needs_root
def test_makes_the_users_dirs_0700_and_a_second_run_is_a_no_op(monkeypatch, shared_root):
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    assert cli.main(["setup-user", "nobody"]) == 0
    expected = (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert owner_and_mode(shared_root / "cache" / str(NOBODY.pw_uid)) == expected
    assert owner_and_mode(shared_root / "data" / "nobody") == expected
    assert owner_and_mode(shared_root / "run" / str(NOBODY.pw_uid)) == expected
    # The default config path lies in nobody's home, /nonexistent: skipped, not made.
    assert not os.path.exists(NOBODY.pw_dir)
    assert cli.main(["setup-user", str(NOBODY.pw_uid)]) == 0


@needs_root
def test_paths_inside_the_users_own_tree_are_made_as_the_user(monkeypatch, shared_root):
    home = shared_root / "home"
    home.mkdir()
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    configure(monkeypatch, shared_root, **node_layout(shared_root),
              ENROOT_CONFIG_PATH=f"{home}/.config/enroot")
    assert cli.main(["setup-user", "nobody"]) == 0
    assert owner_and_mode(home / ".config" / "enroot") == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert os.stat(home / ".config").st_uid == NOBODY.pw_uid
    assert os.geteuid() == 0 and os.getegid() == 0


@needs_root
@pytest.mark.parametrize("key, value, message", [
    ("ENROOT_DATA_PATH", "{root}/data", "ENROOT_DATA_PATH={root}/data: owned by uid 0, not nobody; "
     "a per-user path needs ${{UID}} or ${{USER}} in it"),
    ("ENROOT_RUNTIME_PATH", "{root}/missing/${{UID}}",
     "ENROOT_RUNTIME_PATH={root}/missing/65534: parent {root}/missing does not exist"),
    ("ENROOT_DATA_PATH", "{root}/sysconf/enroot.conf",
     "ENROOT_DATA_PATH={root}/sysconf/enroot.conf: exists and is not a directory"),
])
def test_a_bad_path_fails_naming_it_and_makes_nothing(monkeypatch, capsys, shared_root, key, value, message):
    settings = node_layout(shared_root)
    settings[key] = value.format(root=shared_root)
    configure(monkeypatch, shared_root, **settings)
    assert cli.main(["setup-user", "nobody"]) == 1
    assert capsys.readouterr().err == f"berth: error: {message.format(root=shared_root)}\n"
    assert not (shared_root / "cache" / str(NOBODY.pw_uid)).exists()


@needs_root
def test_unknown_user_is_named(capsys):
    assert cli.main(["setup-user", "bdep-no-such-user"]) == 1
    assert capsys.readouterr().err == "berth: error: setup-user: no such user 'bdep-no-such-user'\n"


def test_refuses_to_run_unprivileged(monkeypatch, capsys, shared_root):
    monkeypatch.setattr(userdirs.os, "geteuid", lambda: 1000)
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    assert cli.main(["setup-user", "nobody"]) == 1
    assert capsys.readouterr().err == "berth: error: setup-user must run as root\n"
    assert not (shared_root / "cache" / str(NOBODY.pw_uid)).exists()
