"""Security issue #11, the start side: what one user, or an image, must not
be able to do to another user's starts or to the host side of a start.

Runs berth like test_container.py (its fixtures): as the throw-away user
`berthtest` through runuser when run as root, with real namespaces,
squashfuse and overlay. The "other user" is uid 65534 (nobody).
"""

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from container_fixture import (
    AS_ROOT,
    berth_pid,
    create_with_env,
    start_detached,
    world_readable_dir,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(not AS_ROOT, reason="plays another user (chown, mount)")


def one_error_line(result, *needles):
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("berth: error:"), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# 1. the runtime's own directories ---------------------------------------------------

@pytest.fixture
def fallback(berth, tmp_path):
    """berth's environment without XDG_RUNTIME_DIR nor ENROOT_RUNTIME_PATH, and a
    TMPDIR like /tmp (sticky, world-writable): the runtime dir falls back to
    $TMPDIR/berth-UID.RANDOM. Returns (run, $TMPDIR)."""
    if os.access(f"/run/user/{berth.user.pw_uid}", os.W_OK):
        pytest.skip("the test user has a /run/user directory")
    tmp = world_readable_dir("bsec-tmp-")
    tmp.chmod(0o1777)
    env = {k: v for k, v in berth.env.items() if k != "ENROOT_RUNTIME_PATH"}
    env["TMPDIR"] = str(tmp)

    def run(*args):
        return subprocess.run(berth.command(*args), env=env, cwd=berth.base,
                              capture_output=True, text=True, timeout=60, check=False)
    yield run, tmp
    shutil.rmtree(tmp)


def runtime_dirs(tmp, uid):
    return sorted(tmp.glob(f"berth-{uid}.*"))


def test_fallback_runtime_dir_is_made_private_and_found_again(fallback, app, berth):
    run, tmp = fallback
    for _ in range(2):
        result = run("start", "app", "true")
        assert result.returncode == 0, result.stderr
        [runtime] = runtime_dirs(tmp, berth.user.pw_uid)  # the second start found the first's
        st = os.lstat(runtime)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == berth.user.pw_uid


# Another user's /tmp/berth-UID, made first, made every start of hers refuse
# until he removed it: her runtime directory's name is one he cannot guess,
# and what he makes in its form (he can guess the prefix) is passed over.
@needs_root
@pytest.mark.parametrize("planted", ["symlink", "dir-0777", "dir-0700", "file", "fifo"])
def test_no_user_can_take_or_block_anothers_fallback_runtime_dir(fallback, app, berth, planted):
    run, tmp = fallback
    uid = berth.user.pw_uid
    target = berth.base / "host"  # the caller's own dir, 0755, for the link
    make = {"symlink": ["ln", "-s", str(target)], "dir-0777": ["mkdir", "-m", "0777"],
            "dir-0700": ["mkdir", "-m", "0700"], "file": ["touch"], "fifo": ["mkfifo"]}[planted]
    planted_paths = [tmp / f"berth-{uid}", tmp / f"berth-{uid}.0", tmp / f"berth-{uid}.zz"]
    for path in planted_paths:  # as the other user, an ordinary one
        subprocess.run(["runuser", "-u", "nobody", "--", *make, str(path)], check=True)
    result = run("start", "app", "true")
    assert result.returncode == 0, result.stderr
    [runtime] = [p for p in runtime_dirs(tmp, uid) if p not in planted_paths]
    assert os.lstat(runtime).st_uid == uid
    for path in planted_paths:  # untouched, and nothing of hers went in there
        st = os.lstat(path)
        assert st.st_uid == NOBODY
        if stat.S_ISDIR(st.st_mode):
            assert list(path.iterdir()) == []
    assert list(target.iterdir()) == []


def test_two_first_starts_at_once_each_see_the_others_start(fallback, app, berth):
    """Each may have made a fallback directory: `list -f` (and `remove`'s
    check that a container is not running) looks in both."""
    run, tmp = fallback
    uid = berth.user.pw_uid
    assert run("start", "app", "true").returncode == 0
    second = tmp / f"berth-{uid}.{'f' * 16}"  # (made as the other start would have)
    subprocess.run(["runuser", "-u", berth.user.pw_name, "--", "mkdir", "-m", "0700",
                    str(second), str(second / "enroot")], check=True)
    process, pid = start_detached(berth, "app", env={"ENROOT_RUNTIME_PATH": f"{second}/enroot"})
    try:
        result = run("list", "-f")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[1].split()[:2] == ["app", str(pid)]
    finally:
        process.stdin.close()
        assert process.wait(timeout=10) == 0


@needs_root
def test_a_runtime_dir_made_meanwhile_is_checked(berth, app):
    """ENROOT_RUNTIME_PATH given, missing, its parent another user's and world-writable."""
    shared = world_readable_dir("bsec-shared-")
    try:
        shared.chmod(0o777)
        os.chown(shared, NOBODY, NOBODY)
        result = berth("start", "app", "true", env={"ENROOT_RUNTIME_PATH": f"{shared}/enroot"})
        one_error_line(result, str(shared))
        assert list(shared.iterdir()) == []
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("key, verb", [
    ("data", ["list"]), ("data", ["start", "app", "true"]), ("cfg", ["start", "app", "true"]),
    ("run", ["start", "app", "true"]),
])
def test_dirs_writable_by_others_are_refused(berth, app, key, verb):
    name = {"data": "ENROOT_DATA_PATH", "cfg": "ENROOT_CONFIG_PATH",
            "run": "ENROOT_RUNTIME_PATH"}[key]
    (berth.base / key).chmod(0o777)
    try:
        one_error_line(berth(*verb), name, str(berth.base / key), "writable by others")
    finally:
        (berth.base / key).chmod(0o755)
    assert berth("start", "app", "true").returncode == 0


@pytest.mark.parametrize("verb", [["cache"], ["cache", "prune", "--max-size", "0"],
                                  ["import", "--cache-only", "docker://127.0.0.1:9#x"]])
def test_a_cache_dir_writable_by_others_is_refused(berth, verb):
    cache = berth.base / "cache"
    cache.mkdir(mode=0o700)
    (cache / "images").mkdir()
    berth.chown(cache)
    cache.chmod(0o777)  # anyone could plant an image the next start mounts
    env = {"ENROOT_CACHE_PATH": str(cache)}
    one_error_line(berth(*verb, env=env), "ENROOT_CACHE_PATH", str(cache), "writable by others")
    assert sorted(p.name for p in cache.iterdir()) == ["images"]
    cache.chmod(0o700)
    assert berth("cache", env=env).returncode == 0


@needs_root
@pytest.mark.parametrize("owner", ["root", "member", "caller"])
@pytest.mark.parametrize("verb", [["import", "--cache-only", "docker://127.0.0.1:9#x"],
                                  ["start", "docker://127.0.0.1:9#x", "true"]])
def test_a_groups_shared_cache_is_refused_naming_the_rule(berth, owner, verb):
    """pyxis's setup guide's group-$(id -g) cache, made as carefully as a
    site could (setgid, group-writable, not world-writable), by root, by a
    member of the group or by the caller: a member (nobody here) has planted
    an image where the caller's import would find it. Nothing cached is
    verified when read, so the caller is refused in one line naming the
    key, the directory and why, and nothing there changes."""
    group = 100  # "users": the caller's and the planter's, no one's private group
    shared = berth.base / f"group-{group}"
    shared.mkdir()
    os.chown(shared, {"root": 0, "member": NOBODY, "caller": berth.user.pw_uid}[owner], group)
    shared.chmod(0o2770)
    (shared / "images").mkdir()
    (shared / "images/planted.sqsh").write_text("the planter's root\n")
    for path in (shared / "images", shared / "images/planted.sqsh"):
        os.chown(path, NOBODY, group)
    before = sorted(str(p.relative_to(shared)) for p in shared.rglob("*"))
    line = one_error_line(berth(*verb, env={"ENROOT_CACHE_PATH": str(shared)}),
                          f"ENROOT_CACHE_PATH {shared}: ",
                          "a cache shared with other users (a group's) is refused")
    assert ("writable by others" if owner == "caller" else "not by you") in line
    assert sorted(str(p.relative_to(shared)) for p in shared.rglob("*")) == before


# 2. the image cannot reach the host side ----------------------------------------------

PAYLOAD_KEYS = ("BASH_ENV", "ENV", "LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "IFS", "PYTHONPATH")


def payload(marker):
    return {"BASH_ENV": f"$(touch {marker})", "ENV": f"$(touch {marker})",
            "LD_PRELOAD": "/nonexistent/evil.so", "LD_LIBRARY_PATH": "/evil/lib",
            "PATH": "/evil/bin:/usr/bin:/bin", "IFS": "/", "PYTHONPATH": "/evil/python",
            "NVIDIA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize("source", ["image", "option"])
def test_container_variables_never_reach_the_hooks(berth, source):
    host = berth.base / "host"
    marker = host / "payload-ran"
    evil = payload(marker)
    create_with_env(berth, "evil",
                    [f"{k}={v}" for k, v in evil.items()] if source == "image" else [])
    # a bash hook (BASH_ENV) and a sh one; each dumps its environment and
    # reads the container's NVIDIA_VISIBLE_DEVICES from $ENROOT_ENVIRON
    for name, shell in (("20-bash.sh", "/bin/bash"), ("21-sh.sh", "/bin/sh")):
        berth.write(f"sys/hooks.d/{name}", f"""#!{shell}
/usr/bin/env -0 > {host}/{name}.env
gpus=$(/bin/sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' "$ENROOT_ENVIRON" | /usr/bin/tail -n 1)
echo "SEEN_BY_{name[:2]}=$gpus" >> "$ENROOT_ENVIRON"
""", mode=0o755)
    options = [] if source == "image" else [a for k, v in evil.items() for a in ("-e", f"{k}={v}")]
    result = berth("start", *options, "evil", "/bin/sh", "-c",
                   'echo "$SEEN_BY_20 $SEEN_BY_21 $LD_LIBRARY_PATH $PYTHONPATH"')
    assert result.returncode == 0, result.stderr
    # the hooks got the container's variable as data, the container keeps its own
    assert result.stdout.split() == ["0", "0", "/evil/lib", "/evil/python"]
    assert not marker.exists(), "the image's BASH_ENV ran on the host side"
    assert "evil.so" not in result.stderr  # the loader never saw LD_PRELOAD
    for name in ("20-bash.sh", "21-sh.sh"):
        dumped = dict(e.split("=", 1) for e in
                      (host / f"{name}.env").read_text().split("\0") if "=" in e)
        for key in PAYLOAD_KEYS:
            assert dumped.get(key) != evil[key], (name, key, dumped.get(key))
        assert "NVIDIA_VISIBLE_DEVICES" not in dumped
        assert dumped["PATH"] == berth.env["PATH"]  # the caller's
        assert dumped["ENROOT_ENVIRON"].endswith("/environ") and "ENROOT_ROOTFS" in dumped


# 3. a mount below the host's /tmp ---------------------------------------------------

@needs_root
def test_start_works_with_something_mounted_below_the_hosts_tmp(berth, app):
    below = Path(world_readable_dir("berth-test-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(below)],
                   check=True)
    try:
        (below / "seen").write_text("below\n")
        out = berth.ok("start", "app", "cat", f"{below}/seen")
        assert out == "below\n"
    finally:
        subprocess.run(["umount", "-l", str(below)], check=True)
        below.rmdir()


# 4. the FUSE server dies with its starter ---------------------------------------------

def _servers(image):
    """The pids of the FUSE servers (either squashfuse) serving `image`,
    whatever options squashserve gives them."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:  # (gone meanwhile)
            continue
        if argv and os.path.basename(argv[0]).startswith(b"squashfuse") \
                and os.fsencode(image) in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("detach", [False, True])
def test_squashfuse_ends_when_its_starter_is_killed(berth, images, detach):
    image = berth.base / "host" / "mine.sqsh"
    shutil.copy(images / "app.sqsh", image)
    berth.chown(image)
    if detach:
        process, _ = start_detached(berth, image)
    else:
        process = subprocess.Popen(berth.command("start", image, "sleep", "60"), env=berth.env,
                                   cwd=berth.base, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    servers = []
    try:
        for _ in range(200):
            servers = _servers(image)
            if servers:
                break
            time.sleep(0.05)
        assert servers, "no squashfuse started"
        os.kill(berth_pid(process), signal.SIGKILL)
        process.wait(timeout=10)
        for _ in range(100):
            if not _servers(image):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"squashfuse {servers} still serving 5 s after its starter was killed")
    finally:
        for pid in _servers(image):
            os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.wait()


def test_squashfuse_keeps_the_hosts_root_and_ends_with_its_start(berth, images):
    """pivot_root makes the container's root the root of every process of its
    mount namespace: a FUSE server there would look up what it opens late
    (glibc loading libgcc_s as squashfuse_ll 0.5's threads end) through the
    mount it serves, and wait on itself in D state for good: the start never
    ends. Bounded: the start ends within 20 s of its stdin's end."""
    image = berth.base / "host" / "mine.sqsh"
    shutil.copy(images / "app.sqsh", image)
    berth.chown(image)
    process, _ = start_detached(berth, image)
    try:
        servers = _servers(image)
        assert servers, "no squashfuse started"
        host = os.stat("/")
        for pid in servers:
            root = os.stat(f"/proc/{pid}/root/")
            assert (root.st_dev, root.st_ino) == (host.st_dev, host.st_ino), \
                f"squashfuse {pid} has the container's root"
        process.stdin.close()
        assert process.wait(timeout=20) == 0, process.stderr.read()
        assert _servers(image) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# 5. export strips setuid/setgid unless asked ------------------------------------------

def _modes(berth, sqsh):
    listing = subprocess.run(["unsquashfs", "-lls", str(sqsh)], capture_output=True,
                             text=True, check=True).stdout
    return {line.split()[-1].rsplit("/", 1)[-1]: line.split()[0]
            for line in listing.splitlines() if "squashfs-root/work/" in line}


def test_export_strips_setuid_unless_kept(berth, app):
    berth.ok("start", "--rw", "app", "sh", "-c",
             "cd /work && cp /bin/busybox su && chmod 4755 su && cp su sg && chmod 2755 sg"
             " && cp su plain && chmod 0755 plain && mkdir d && chmod 2775 d")
    berth.ok("export", "-o", "out.sqsh", "app")
    modes = _modes(berth, berth.base / "out.sqsh")
    assert modes == {"su": "-rwxr-xr-x", "sg": "-rwxr-xr-x", "plain": "-rwxr-xr-x",
                     "d": "drwxrwsr-x"}, modes
    berth.ok("export", "--keep-setuid", "-f", "-o", "out.sqsh", "app")
    modes = _modes(berth, berth.base / "out.sqsh")
    assert modes["su"] == "-rwsr-xr-x" and modes["sg"] == "-rwxr-sr-x", modes
    assert "--keep-setuid" in berth.ok("export", "--help")


# 6. one line, never a traceback ----------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["create", "-n", "x" * 300, "{images}/app.sqsh"], "-n/--name: invalid container name"),
    (["create", "-n", "a\nb", "{images}/app.sqsh"], "-n/--name: invalid container name"),
    (["create", "-n", "tab\there", "{images}/app.sqsh"], "-n/--name"),
    (["start", "x" * 300, "true"], "NAME: invalid container name"),
    (["start", "a\nb", "true"], "NAME: invalid container name"),
    (["remove", "a\nb"], "NAME: invalid container name"),
    (["export", "x" * 300], "NAME: invalid container name"),
])
def test_bad_names_are_one_line(berth, images, args, needle):
    result = berth(*(a.format(images=images) for a in args))
    one_error_line(result, needle)
    assert "\n" not in result.stderr.strip()
    assert berth.ok("list") == ""


def test_non_utf8_enroot_conf_is_named(berth):
    conf = berth.write("sys/enroot.conf", "ENROOT_MOUNT_HOME no\n")
    conf.write_bytes(b"ENROOT_MOUNT_HOME no\nENROOT_REMAP_ROOT \xff\xfe\n")
    one_error_line(berth("list"), f"{conf}:2", "UTF-8")


@needs_root
def test_unreadable_enroot_conf_is_named(berth):
    conf = berth.write("sys/enroot.conf", "ENROOT_MOUNT_HOME no\n")
    os.chown(conf, 0, 0)
    conf.chmod(0o600)
    one_error_line(berth("list"), str(conf), "cannot read")


def test_non_utf8_environ_file_is_named(berth, app):
    env = berth.write("cfg/environ.d/10-mine.env", "A=1\n")
    env.write_bytes(b"A=1\nB=\xff\n")
    one_error_line(berth("start", "app", "true"), f"{env}:2", "UTF-8")
    fstab = berth.write("cfg/mounts.d/10-mine.fstab", "")
    env.unlink()
    fstab.write_bytes(b"# \xff\n")
    one_error_line(berth("start", "app", "true"), f"{fstab}:1", "UTF-8")


def test_list_shows_one_line_per_container_even_for_old_bad_names(berth, app):
    """A name an older berth accepted (a newline in it) is shown escaped."""
    (berth.base / "data" / "evil\nname").mkdir()
    berth.chown(berth.base / "data")
    assert berth.ok("list").splitlines() == ["app", "evil\\nname"]
    assert [row.split()[0] for row in berth.ok("list", "-f").splitlines()] == [
        "NAME", "app", "evil\\nname"]
