"""`berth setup-user`: per-user runtime directories made by root for one user."""

import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from berth import cli  # noqa: E402
from berth.site import userdirs  # noqa: E402

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
def test_the_pyxis_guides_id_commands_name_the_user_not_root(monkeypatch, shared_root):
    """A site's enroot.conf from its pyxis days: $(id -u) and $(id -un) are
    read in the child that became the user, so they are the user's."""
    for shared in ("cache", "data", "run"):
        (shared_root / shared).mkdir(mode=0o755)
    configure(monkeypatch, shared_root, ENROOT_CACHE_PATH=f"{shared_root}/cache/user-$(id -u)",
              ENROOT_DATA_PATH=f"{shared_root}/data/$(id -un)",
              ENROOT_RUNTIME_PATH=f"{shared_root}/run/user-$(id -u)")
    assert cli.main(["setup-user", "nobody"]) == 0
    expected = (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert owner_and_mode(shared_root / f"cache/user-{NOBODY.pw_uid}") == expected
    assert owner_and_mode(shared_root / "data/nobody") == expected
    assert owner_and_mode(shared_root / f"run/user-{NOBODY.pw_uid}") == expected
    assert sorted(p.name for p in shared_root.glob("*/*")) == sorted(
        ["nobody", f"user-{NOBODY.pw_uid}", f"user-{NOBODY.pw_uid}", "enroot.conf"])


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
    ("ENROOT_CACHE_PATH", "cache/${{UID}}", "ENROOT_CACHE_PATH=cache/65534: not an absolute path"),
])
def test_a_bad_path_fails_naming_it_and_makes_nothing(monkeypatch, capsys, shared_root, key, value, message):
    settings = node_layout(shared_root)
    settings[key] = value.format(root=shared_root)
    configure(monkeypatch, shared_root, **settings)
    assert cli.main(["setup-user", "nobody"]) == 1
    assert capsys.readouterr().err == f"berth: error: {message.format(root=shared_root)}\n"
    assert not (shared_root / "cache" / str(NOBODY.pw_uid)).exists()


@needs_root
@pytest.mark.parametrize("name", ["bdep-no-such-user", "\u00b2", "9" * 5000])
def test_unknown_user_is_named(capsys, name):
    """'²' passed str.isdigit() and 5,000 digits int()'s limit: tracebacks."""
    assert cli.main(["setup-user", name]) == 1
    assert capsys.readouterr().err == f"berth: error: setup-user: no such user '{name}'\n"


def test_refuses_to_run_unprivileged(monkeypatch, capsys, shared_root):
    monkeypatch.setattr(userdirs.os, "geteuid", lambda: 1000)
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    assert cli.main(["setup-user", "nobody"]) == 1
    assert capsys.readouterr().err == "berth: error: setup-user must run as root\n"
    assert not (shared_root / "cache" / str(NOBODY.pw_uid)).exists()


# -- a user's own tree is theirs, not root's (issue #11) ----------------------

ATTACKER, VICTIM, GROUP = "bdep-ud-a", "bdep-ud-v", "bdep-ud-g"


def _drop_account(name):
    subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def people(shared_root):
    """Two throw-away users with homes in shared_root: (attacker, victim)."""
    users = []
    for name in (ATTACKER, VICTIM):
        _drop_account(name)
        home = shared_root / name
        subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        user = pwd.getpwnam(name)
        home.mkdir(mode=0o755)
        os.chown(home, user.pw_uid, user.pw_gid)
        users.append(user)
    yield users
    for name in (ATTACKER, VICTIM):
        _drop_account(name)


def as_owner(user, *paths):
    for path in paths:
        os.lchown(path, user.pw_uid, user.pw_gid)


def tree(path):
    """Every path below `path` with its owner, links not followed."""
    return sorted((str(p), p.lstat().st_uid) for p in Path(path).rglob("*"))


def setup_user(name, capsys):
    status = cli.main(["setup-user", name])
    return status, capsys.readouterr().err


@needs_root
@pytest.mark.parametrize("victim_has_enroot", [False, True])
def test_a_config_link_into_another_users_home_is_not_followed(
        monkeypatch, capsys, shared_root, people, victim_has_enroot):
    attacker, victim = people
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    victim_config = Path(victim.pw_dir) / ".config"
    victim_config.mkdir(mode=0o755)
    if victim_has_enroot:
        (victim_config / "enroot").mkdir(mode=0o700)
        (victim_config / "enroot" / "environ").write_text("SECRET=1\n")
        as_owner(victim, victim_config / "enroot", victim_config / "enroot" / "environ")
    as_owner(victim, victim_config)
    before = tree(victim.pw_dir)
    link = Path(attacker.pw_dir) / ".config"
    link.symlink_to(victim_config)
    as_owner(attacker, link)
    status, err = setup_user(ATTACKER, capsys)
    assert status == 0, err
    assert tree(victim.pw_dir) == before
    [line] = err.splitlines()
    assert line.startswith(f"berth: warning: setup-user {ATTACKER}: ENROOT_CONFIG_PATH="
                           f"{attacker.pw_dir}/.config/enroot: ")
    # The shared-root paths were made all the same.
    assert owner_and_mode(shared_root / "cache" / str(attacker.pw_uid)) == \
        (attacker.pw_uid, attacker.pw_gid, 0o700)


@needs_root
@pytest.mark.parametrize("kind, message", [
    ("dangling", "a dangling symbolic link"),
    ("file", "exists and is not a directory"),
    ("others", "owned by uid {victim}, not " + ATTACKER),
    ("link-to-others", "a symbolic link to {target}, not a directory of " + ATTACKER),
    ("config-is-a-file", "Not a directory"),
])
def test_a_broken_config_dir_of_the_user_is_a_warning_not_a_drained_node(
        monkeypatch, capsys, shared_root, people, kind, message):
    attacker, victim = people
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    config_dir = Path(attacker.pw_dir) / ".config"
    config_dir.mkdir()
    as_owner(attacker, config_dir)
    path = config_dir / "enroot"
    target = shared_root / VICTIM / "enroot"
    if kind == "dangling":
        path.symlink_to(shared_root / "nowhere")
    elif kind == "file":
        path.write_text("")
    elif kind == "others":
        path.mkdir()
        as_owner(victim, path)
    elif kind == "link-to-others":
        target.mkdir()
        as_owner(victim, target)
        path.symlink_to(target)
    else:
        shutil.rmtree(config_dir)
        config_dir.write_text("")
        path = config_dir
    if kind != "others":
        as_owner(attacker, path)
    before = tree(shared_root / VICTIM)
    status, err = setup_user(ATTACKER, capsys)
    assert status == 0, err
    expected = message.format(victim=victim.pw_uid, target=target)
    assert err == f"berth: warning: setup-user {ATTACKER}: ENROOT_CONFIG_PATH=" \
                  f"{attacker.pw_dir}/.config/enroot: {expected}\n"
    assert tree(shared_root / VICTIM) == before
    assert os.lstat(path).st_uid == (victim if kind == "others" else attacker).pw_uid


@needs_root
def test_a_users_link_never_leads_root_to_make_a_directory(monkeypatch, capsys, shared_root,
                                                           people):
    """A path in the user's tree whose parent is a root-owned directory the
    user links to (/etc, say): root makes nothing there."""
    attacker, _ = people
    etc = shared_root / "etc"
    etc.mkdir(mode=0o755)
    configure(monkeypatch, shared_root, **node_layout(shared_root),
              ENROOT_CONFIG_PATH=f"{attacker.pw_dir}/etc/enroot")
    link = Path(attacker.pw_dir) / "etc"
    link.symlink_to(etc)
    as_owner(attacker, link)
    status, err = setup_user(ATTACKER, capsys)
    assert status == 0, err
    assert os.listdir(etc) == []
    assert err.startswith(f"berth: warning: setup-user {ATTACKER}: ENROOT_CONFIG_PATH="
                          f"{attacker.pw_dir}/etc/enroot: not made: ")


@needs_root
def test_a_link_swapped_in_after_mkdir_is_never_chowned(monkeypatch, capsys, shared_root, people):
    """The race between root's mkdir and its chown: whatever replaced the new
    directory (a link to a root file here) is not followed."""
    attacker, _ = people
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    precious = shared_root / "precious"
    precious.write_text("root's\n")
    made = shared_root / "cache" / str(attacker.pw_uid)
    real_mkdir = os.mkdir

    def racing_mkdir(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        if made.is_dir() and not made.is_symlink():
            made.rmdir()
            made.symlink_to(precious)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    status, err = setup_user(ATTACKER, capsys)
    monkeypatch.setattr(os, "mkdir", real_mkdir)
    assert status == 0, err
    assert os.stat(precious).st_uid == 0 and os.lstat(made).st_uid == 0
    assert f"ENROOT_CACHE_PATH={made}: " in err and "left as it is" in err
    # The other shared paths were made as usual.
    assert os.stat(shared_root / "data" / ATTACKER).st_uid == attacker.pw_uid


@needs_root
def test_the_user_side_runs_without_roots_groups(monkeypatch, capsys, shared_root, people):
    """Work in the user's tree runs with the user's groups only: a directory
    of root's supplementary group stays closed even when a link leads there
    halfway (a component swapped for a link while the path is being made)."""
    attacker, _ = people
    subprocess.run(["groupdel", GROUP], check=False, capture_output=True)
    subprocess.run(["groupadd", GROUP], check=True, capture_output=True)
    group = grp.getgrnam(GROUP).gr_gid
    closed = shared_root / "closed"
    closed.mkdir()
    os.chown(closed, 0, group)
    closed.chmod(0o770)
    configure(monkeypatch, shared_root, **node_layout(shared_root),
              ENROOT_CONFIG_PATH=f"{attacker.pw_dir}/.config/enroot")
    step = Path(attacker.pw_dir) / ".config"
    real_mkdir = os.mkdir

    def racing_mkdir(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        if str(path) == str(step):
            os.rmdir(step)
            os.symlink(closed, step)

    groups = os.getgroups()
    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    os.setgroups([group])
    try:
        status, err = setup_user(ATTACKER, capsys)
    finally:
        os.setgroups(groups)
        monkeypatch.setattr(os, "mkdir", real_mkdir)
        subprocess.run(["groupdel", GROUP], check=False, capture_output=True)
    assert status == 0, err
    assert os.listdir(closed) == []
    assert f"ENROOT_CONFIG_PATH={step}/enroot: Permission denied; not made" in err


@needs_root
def test_a_link_to_the_users_own_directory_is_fine(monkeypatch, capsys, shared_root, people):
    attacker, _ = people
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    own = Path(attacker.pw_dir) / "elsewhere"
    own.mkdir(mode=0o700)
    (Path(attacker.pw_dir) / ".config").mkdir()
    link = Path(attacker.pw_dir) / ".config" / "enroot"
    link.symlink_to(own)
    as_owner(attacker, own, link.parent, link)
    assert setup_user(ATTACKER, capsys) == (0, "")


def _kill_setup_user_of(uid, signum, stop):
    """Signal every `berth setup-user` process of `uid`, as its user can
    (`pkill -u USER -f "berth setup-user"` in a loop), until `stop` is set."""
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
                if f"\nUid:\t{uid}\t" in status and b"setup-user" in command:
                    os.kill(int(pid), signum)
            except (OSError, ValueError):
                continue


@needs_root
def test_the_user_killing_her_side_is_a_warning_not_a_drained_node(monkeypatch, shared_root,
                                                                  people):
    attacker, _ = people
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    stop = threading.Event()
    killer = threading.Thread(target=_kill_setup_user_of,
                              args=(attacker.pw_uid, signal.SIGKILL, stop), daemon=True)
    killer.start()
    # Her side is made slow, so the test does not depend on winning a race
    # against a child that lives for milliseconds; the kill is still hers.
    slow_side = ("import sys, time\n"
                 "from berth.site import userdirs\n"
                 "userdirs._plan_all = lambda env, user: time.sleep(60)\n"
                 "from berth.cli import main\n"
                 "sys.exit(main(sys.argv[1:]))\n")
    try:
        run = subprocess.run([sys.executable, "-c", slow_side, "setup-user", ATTACKER],
                             env={**os.environ, "PYTHONPATH": str(REPO / "runtime")},
                             capture_output=True, text=True, timeout=60)
    finally:
        stop.set()
        killer.join(10)
    assert run.returncode == 0, run.stderr
    [line] = run.stderr.splitlines()
    assert line == (f"berth: warning: setup-user {ATTACKER}: the process working as {ATTACKER} "
                    "was killed by signal 9; the user's directories may be missing (the job's own "
                    "berth says which)")


@needs_root
def test_a_stopped_user_side_is_killed_after_its_bound(monkeypatch, capsys, shared_root, people):
    configure(monkeypatch, shared_root, **node_layout(shared_root))
    monkeypatch.setattr(userdirs, "USER_PART_SECONDS", 1)
    # what a SIGSTOP from the user does to the child: it never answers
    monkeypatch.setattr(userdirs, "_plan_all", lambda env, user: time.sleep(600))
    started = time.monotonic()
    status, err = setup_user(ATTACKER, capsys)
    assert status == 0, err
    assert time.monotonic() - started < 10
    assert err == (f"berth: warning: setup-user {ATTACKER}: the process working as {ATTACKER} "
                   "gave no answer in 1 s; killed it; the user's directories may be missing (the "
                   "job's own berth says which)\n")
