"""`berth start -m` and mounts.d in pyxis's and enroot's forms, in real
namespaces as an unprivileged user (the fixtures are test_container's)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from container_fixture import berth_pid, squash, start_detached

from berth.container import mounts


def _mountinfo_line(berth, target, *args):
    """The container's /proc/self/mountinfo line of `target` (mounted through -m args)."""
    out = berth.ok("start", *args, "app", "cat", "/proc/self/mountinfo")
    found = [line for line in out.splitlines() if line.split()[4] == target]
    assert found, out
    return found[-1]


@pytest.fixture
def host(berth):
    path = berth.base / "host"
    (path / "in").write_text("from host\n")
    berth.chown(path)
    return path


def test_short_and_relative_sources(berth, app, host):
    # SRC alone: the same path inside
    assert berth.ok("start", "-m", host, "app", "cat", f"{host}/in") == "from host\n"
    # relative sources, from berth's working directory (berth.base)
    assert berth.ok("start", "-m", "host:/rel", "app", "cat", "/rel/in") == "from host\n"
    assert berth.ok("start", "-m", "./host/in:/one-file:ro", "app",
                    "cat", "/one-file") == "from host\n"
    assert berth.ok("start", "-m", "host", "app", "cat", f"{host}/in") == "from host\n"


def test_tmpfs_with_options(berth, app):
    line = _mountinfo_line(berth, "/scratch", "-m", "tmpfs:/scratch:size=1m+mode=0700+nosuid")
    assert " - tmpfs tmpfs " in line and "size=1024k" in line and "mode=700" in line, line
    assert "nosuid" in line.split()[5], line
    out = berth.ok("start", "-m", "tmpfs:/new/dir", "app", "sh", "-c",
                   "echo x > /new/dir/f && cat /new/dir/f")
    assert out == "x\n"
    huge = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    if huge.exists():
        line = _mountinfo_line(berth, "/h", "-m", "tmpfs:/h:huge=within_size")
        assert "huge=within_size" in line, line


def test_umount_removes_a_default_or_mounts_d_mount(berth, app, host):
    probe = Path("/tmp/bctr-umount-probe")
    probe.write_text("host tmp\n")
    try:
        assert berth.ok("start", "app", "cat", str(probe)) == "host tmp\n"
        result = berth("start", "-m", "umount:/tmp", "app", "cat", str(probe))
        assert result.returncode != 0 and "No such file" in result.stderr
    finally:
        probe.unlink()
    berth.write("sys/mounts.d/10-site.fstab", f"{host} /site none bind,x-create=dir\n")
    assert berth.ok("start", "app", "cat", "/site/in") == "from host\n"
    assert berth.ok("start", "-m", "umount:/site", "app", "ls", "/site") == ""
    # enroot's fstab form: x-detach
    berth.write("cfg/mounts.d/20-me.fstab", "none /site none x-detach\n")
    assert berth.ok("start", "app", "ls", "/site") == ""
    berth.fails("start", "-m", "umount:/work", "app", "true",
                needle="-m umount:/work: nothing is mounted at /work")
    berth.ok("start", "-m", "umount:/work:nofail", "app", "true")
    berth.fails("start", "-m", "umount:/tmp:ro", "app", "true",
                needle="umount:DST takes no flag but nofail, got 'ro'")


def test_umount_comes_after_the_hooks_mounts(berth, app, host):
    """As under pyxis and enroot: `umount:/root` of the job removes what the
    home hook mounted there (--container-mount-home with a remapped root)."""
    berth.write("sys/hooks.d/10-home.sh", f"#!/bin/sh\necho '{host} /root none rbind,x-create=dir' "
                ">>\"$ENROOT_MOUNTS\"\n", mode=0o755)
    assert berth.ok("start", "app", "ls", "/root") == "in\n"
    assert berth.ok("start", "-m", "umount:/root", "app", "ls", "/root") == ""


def test_fstab_lines_may_leave_out_the_type(berth, app, host):
    berth.write("cfg/mounts.d/10-short.fstab", f"tmpfs /tmp\n{host} /work rbind,ro\n")
    out = berth.ok("start", "app", "sh", "-c", "cat /work/in; grep -E ' /(tmp|work) ' "
                   "/proc/self/mountinfo")
    lines = out.splitlines()
    assert lines[0] == "from host"
    last = {line.split()[4]: line for line in lines[1:]}  # the top mount at each
    assert " - tmpfs tmpfs " in last["/tmp"], out
    assert last["/work"].split()[5].startswith("ro,"), out
    berth.write("cfg/mounts.d/10-short.fstab", f"{host} /work\n")
    berth.fails("start", "app", "true", needle="10-short.fstab:1: expected 'SRC DST TYPE")


def test_remount_gives_new_flags_to_what_is_mounted(berth, app):
    """enroot's fstab `none DST none rbind,remount,ro,...` (its 10-cgroups.sh
    ends with one): the mount already at DST becomes read-only, SRC unused;
    a missing DST with nofail is skipped. `-m` takes no remount."""
    berth.write("cfg/mounts.d/10-tmp.fstab", "tmpfs /scratch tmpfs x-create=dir,size=1m\n"
                "none /scratch none rbind,remount,nosuid,ro,rslave,silent\n"
                "none /nowhere none rbind,remount,ro,nofail\n")
    out = berth.ok("start", "app", "sh", "-c",
                   "touch /scratch/f 2>/dev/null && echo wrote; cat /proc/self/mountinfo")
    assert "wrote" not in out
    last = {line.split()[4]: line for line in out.splitlines()}
    assert last["/scratch"].split()[5].startswith("ro,nosuid"), out
    assert "/nowhere" not in last
    berth.fails("start", "-m", "/tmp:/b:remount", "app", "true",
                needle="remount is for fstab lines")


def test_x_move_moves_a_mount_in_the_container(berth, app):
    berth.write("cfg/mounts.d/10-move.fstab", "tmpfs /a tmpfs x-create=dir,size=1m\n"
                "/a /b none x-move,x-create=dir\n")
    out = berth.ok("start", "app", "cat", "/proc/self/mountinfo")
    targets = {line.split()[4]: line for line in out.splitlines()}
    assert "/a" not in targets and " - tmpfs " in targets["/b"], out
    berth.write("cfg/mounts.d/10-move.fstab", "/work /b none x-move,x-create=dir\n")
    berth.fails("start", "app", "true", needle="cannot move the mount at /work")
    berth.fails("start", "-m", "/a:/b:x-move", "app", "true", needle="x-move is for fstab lines")


ENROOT_FLAGS = [
    "ro", "rw", "bind", "rbind", "nofail", "x-create=dir", "x-create=auto", "defaults",
    "unbindable", "runbindable", "private", "rprivate", "slave", "rslave", "shared", "rshared",
    "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "nodiratime",
    "diratime", "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime",
    "nolazytime", "iversion", "noiversion", "sync", "async", "dirsync", "silent", "loud",
    "mand", "nomand", "nosymfollow", "sqsh",
]


def test_every_enroot_flag_is_known():
    for flag in ENROOT_FLAGS:
        mount = mounts.parse_spec(f"/src:/dst:{flag}")
        assert flag in mount.options
    with pytest.raises(mounts.BerthError, match="unknown mount flag 'bogus'"):
        mounts.parse_spec("/src:/dst:ro+bogus")
    with pytest.raises(mounts.BerthError, match="unknown mount flag 'color=red'"):
        mounts.parse_spec("tmpfs:/dst:size=1m+color=red")
    with pytest.raises(mounts.BerthError, match="-m takes umount:DST"):
        mounts.parse_spec("/src:/dst:x-detach")
    with pytest.raises(mounts.BerthError, match="unknown mount flag 'size=1m'"):
        mounts.parse_spec("/src:/dst:size=1m")  # tmpfs's options are no bind flags


def test_flags_take_effect(berth, app, host):
    line = _mountinfo_line(berth, "/m", "-m", f"{host}:/m:ro+nosuid+nodev+noexec+unbindable")
    options = line.split()[5].split(",")
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(options), line
    # flags combine the way they are listed: the last of ro/rw wins
    assert "rw" in _mountinfo_line(berth, "/m", "-m", f"{host}:/m:ro+rw").split()[5].split(",")
    line = _mountinfo_line(berth, "/m", "-m", f"{host}:/m:x-create=dir+runbindable+nodev")
    assert "nodev" in line.split()[5].split(","), line


def test_propagation_flags_take_effect(berth, app, host):
    outside = berth.ok("start", "app", "cat", "/proc/self/uid_map").split()[1]
    if outside != str(berth.user.pw_uid):
        pytest.skip("a second, nested mount namespace resets the propagation set at mount time")
    line = _mountinfo_line(berth, "/m", "-m", f"{host}:/m:ro+unbindable")
    assert "unbindable" in line.split(" - ")[0].split()[6:], line
    line = _mountinfo_line(berth, "/m", "-m", f"{host}:/m:rshared")
    assert any(field.startswith("shared:") for field in line.split(" - ")[0].split()[6:]), line


def test_unknown_flags_are_refused_by_name(berth, app, host):
    berth.fails("start", "-m", f"{host}:/x:ro+frobnicate", "app", "true",
                needle="unknown mount flag 'frobnicate'")
    berth.fails("start", "-m", "tmpfs:/x:size=1m+frobnicate", "app", "true",
                needle="unknown mount flag 'frobnicate'")
    berth.write("cfg/mounts.d/50-bad.fstab", f"{host} /x none bind,x-create=dir,frobnicate\n")
    berth.fails("start", "app", "true", needle="50-bad.fstab:1: unknown mount flag 'frobnicate'")


def test_destination_that_escapes_the_root_fails_naming_it(berth, app, host):
    berth.fails("start", "-m", f"{host}:/../../x", "app", "true",
                needle="mount destination /../../x escapes the container root")
    (app / "esc").symlink_to("../../../..")
    os.lchown(app / "esc", berth.user.pw_uid, berth.user.pw_gid)  # never berth.chown a link
    berth.fails("start", "-m", f"{host}:/esc/x", "app", "true",
                needle="mount destination /esc/x escapes the container root")
    # an absolute link is read with the container's root as /: it stays inside
    (app / "abs").symlink_to("/work")
    os.lchown(app / "abs", berth.user.pw_uid, berth.user.pw_gid)
    assert berth.ok("start", "-m", f"{host}:/abs/sub", "app", "cat", "/work/sub/in") == \
        "from host\n"


def test_missing_source_fails_naming_it_unless_nofail(berth, app):
    berth.fails("start", "-m", "/no/such/dir:/x", "app", "true",
                needle="mount source path does not exist: /no/such/dir")
    berth.fails("start", "-m", "missing:/x", "app", "true",
                needle=f"mount source path does not exist: {berth.base}/missing")
    berth.ok("start", "-m", "/no/such/dir:/x:nofail", "app", "true")


@pytest.fixture
def data_image(berth, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub/file.txt").write_text("in the squashfs\n")
    image = berth.base / "host/data.sqsh"
    squash(tree, image)
    berth.chown(image)
    return image


def _squashfuse_servers(berth):
    """squashfuse processes (either server) serving an image of this test
    (others may run beside it)."""
    return subprocess.run(
        ["pgrep", "-u", str(berth.user.pw_uid), "-f", f"squashfuse(_ll)? .*{berth.base}"],
        capture_output=True, text=True).stdout.split()


def test_sqsh_mounts_a_squashfs_read_only(berth, app, images, data_image):
    out = berth.ok("start", "-m", f"{data_image}:/data:sqsh", "app", "sh", "-c",
                   "cat /data/sub/file.txt; touch /data/x 2>/dev/null || echo read-only")
    assert out == "in the squashfs\nread-only\n"
    # relative, on an image started without unpacking, in a directory it lacks
    out = berth.ok("start", "-m", "host/data.sqsh:/new/data:sqsh", images / "app.sqsh",
                   "cat", "/new/data/sub/file.txt")
    assert out == "in the squashfs\n"
    assert _squashfuse_servers(berth) == []
    berth.fails("start", "-m", f"{images}/../bctr-nothing.sqsh:/d:sqsh", "app", "true",
                needle="does not exist")
    berth.write("host/text", "not an image\n")
    berth.fails("start", "-m", f"{berth.base}/host/text:/d:sqsh", "app", "true",
                needle=f"mount source {berth.base}/host/text: not a squashfs or SIF image")


def test_sqsh_server_dies_with_berth(berth, app, data_image):
    process, pid = start_detached(berth, "-m", f"{data_image}:/data:sqsh", "app")
    assert berth.ok("exec", pid, "cat", "/data/sub/file.txt") == "in the squashfs\n"
    assert len(_squashfuse_servers(berth)) == 1
    os.kill(berth_pid(process), signal.SIGKILL)
    process.wait(timeout=10)
    for _ in range(100):
        if not _squashfuse_servers(berth):
            break
        time.sleep(0.05)
    else:
        pytest.fail("squashfuse still running after berth was killed")


def test_edf_sqsh_mount_reaches_start(berth, app, data_image):
    """An EDF's `sqsh` mount, as the SPANK plugin carries it (edf show --spank
    mount= lines, each passed to start -m), mounts the image read-only."""
    berth.write("edf/data.toml", 'mounts = ["${DATA}:/data:sqsh"]\n')
    env = {"EDF_PATH": str(berth.base / "edf"), "DATA": str(data_image)}
    lines = berth.ok("edf", "show", "--spank", "data", env=env).splitlines()
    specs = [line.split("=", 1)[1] for line in lines if line.startswith("mount=")]
    assert specs == [f"{data_image}:/data:sqsh"]
    out = berth.ok("start", *(a for spec in specs for a in ("-m", spec)), "app", "sh", "-c",
                   "cat /data/sub/file.txt; grep -c ' /data fuse.squashfuse ro,' /proc/mounts")
    assert out == "in the squashfs\n1\n"
