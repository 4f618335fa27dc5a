"""The user namespace of a container and what a fake root needs, as enroot
and pyxis give them, run like test_container.py: one user
namespace mapped `UID UID 1` (`0 UID 1` with --root), the seccomp filter
that makes chown/setuid-style calls succeed without effect, the home at
/root for a remapped root, and the namespaces of --uts, --ipc and --net.
"""

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from container_fixture import AS_ROOT, berth_pid, start_detached
from test_hooks_std import hooked  # noqa: F401 (fixture)


def test_one_user_namespace_mapped_as_enroot_maps_it(berth, app, images):
    uid, gid = berth.user.pw_uid, berth.user.pw_gid
    show = "cat /proc/self/uid_map /proc/self/gid_map; readlink /proc/self/ns/user"
    for target in ("app", images / "app.sqsh"):
        plain = berth.ok("start", target, "sh", "-c", show).split()
        assert plain[:6] == [str(uid), str(uid), "1", str(gid), str(gid), "1"]
        remapped = berth.ok("start", "--root", target, "sh", "-c", show).split()
        assert remapped[:6] == ["0", str(uid), "1", "0", str(gid), "1"]


@pytest.mark.parametrize("root", [[], ["--root"]])
def test_detached_container_and_exec_share_its_one_user_namespace(berth, app, root):
    uid = berth.user.pw_uid
    process, pid = start_detached(berth, *root, "--pid", "app")
    try:
        # seen from the host: the keeper's namespace maps onto the caller directly
        assert Path(f"/proc/{pid}/uid_map").read_text().split() == [
            "0" if root else str(uid), str(uid), "1"]
        out = berth.ok("exec", pid, "sh", "-c", "cat /proc/self/uid_map; id -u; "
                       "grep Seccomp: /proc/self/status; chgrp 0 /tmp/../proc/self/../../work "
                       "2>&1 || echo chgrp-failed").split()
        assert out == ["0" if root else str(uid), str(uid), "1", "0" if root else str(uid),
                       "Seccomp:", "2"]
        assert Path(f"/proc/{pid}/status").read_text().count("Seccomp:\t2") == 1
    finally:
        process.stdin.close()
        assert process.wait(timeout=10) == 0


# A dpkg-like maintainer script: a fake root changes owners and groups and
# drops privileges; every call must succeed (changing nothing).
POSTINST = """set -e
touch /work/shadow-like
chown root /work/shadow-like
chgrp 42 /work/shadow-like
chown -R 0:0 /work
chown -h 100:100 /work/shadow-like
su_like() { chroot --userspec=100:100 / true 2>/dev/null || true; }
su_like
grep Seccomp: /proc/self/status
stat -c '%u' /work/shadow-like
"""


@pytest.mark.parametrize("root", [[], ["--root"]])
def test_fake_root_calls_succeed_under_the_seccomp_filter(berth, app, images, root):
    uid = berth.user.pw_uid
    for target in ("app", images / "app.sqsh"):
        out = berth.ok("start", "--rw", *root, target, "sh", "-c", POSTINST)
        assert out.split() == ["Seccomp:", "2", "0" if root else str(uid)]
    # busybox's chgrp/chown themselves, and setuid-style calls of a tool
    out = berth.ok("start", *root, "app", "sh", "-c",
                   "chgrp 0 /tmp && chown 0:0 /tmp && echo ok")
    assert out == "ok\n"


def test_remapped_root_gets_the_home_at_root(hooked, app):
    home = hooked.user.pw_dir
    probe = Path(home, ".bctr-root-home-probe")
    probe.write_text("mine\n")
    try:
        out = hooked.ok("start", "--root", "app", "sh", "-c",
                        "echo $HOME; cat /root/.bctr-root-home-probe",
                        env={"ENROOT_MOUNT_HOME": "yes"})
        assert out == "/root\nmine\n"
        out = hooked.ok("start", "app", "sh", "-c", "echo $HOME",
                        env={"ENROOT_MOUNT_HOME": "yes"})
        assert out == f"{home}\n"  # not remapped: at its own path
    finally:
        probe.unlink()


def test_the_home_mounted_is_the_callers_HOME(hooked, app):
    """As enroot's home mount: `HOME=/tmp srun --container-mount-home
    --container-remap-root` finds /tmp's files at /root; a HOME that is no
    absolute directory, or could break the mount line, is one line naming HOME."""
    elsewhere = hooked.base / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "probe").write_text("from HOME\n")
    hooked.chown(elsewhere)

    def start(home, *args):  # (runuser would set HOME from the passwd entry)
        command = hooked.command("start", *args)
        at = command.index("/usr/bin/python3")
        return subprocess.run([*command[:at], "env", f"HOME={home}", *command[at:]],
                              env={**hooked.env, "ENROOT_MOUNT_HOME": "yes"}, cwd=hooked.base,
                              capture_output=True, text=True, timeout=60, check=False)

    out = start(elsewhere, "--root", "app", "sh", "-c", "echo $HOME; cat /root/probe")
    assert out.stdout == "/root\nfrom HOME\n", out.stderr
    out = start(elsewhere, "app", "sh", "-c", "echo $HOME; cat ~/probe")
    assert out.stdout == f"{elsewhere}\nfrom HOME\n", out.stderr
    for home, said in (("relative/dir", "HOME 'relative/dir' is not an absolute path"),
                       ("/no/such/dir", "HOME /no/such/dir is not a directory"),
                       (f"{elsewhere} /etc /x none bind", "HOME holds a space or control"),
                       (f"{elsewhere}\n/etc /x none bind", "HOME holds a space or control")):
        result = start(home, "--root", "app", "true")
        assert result.returncode == 1 and f"10-home.sh: {said}" in result.stderr, result.stderr


def test_remapped_root_sets_its_own_hostname(berth, app):
    out = berth.ok("start", "--root", "--uts", "app", "sh", "-c", "hostname foo && hostname")
    assert out == "foo\n"
    assert os.uname().nodename != "foo"
    process, pid = start_detached(berth, "--root", "--uts", "app")
    try:
        assert berth.ok("exec", pid, "sh", "-c", "hostname bar && hostname") == "bar\n"
    finally:
        process.stdin.close()
        assert process.wait(timeout=10) == 0


@pytest.mark.parametrize("restrict_dev", ["no", "yes"])
def test_ipc_gives_a_private_dev_shm_and_mqueue(berth, app, restrict_dev):
    name = f"bctr-shm-probe-{os.getpid()}"
    env = {"ENROOT_RESTRICT_DEV": restrict_dev}
    out = berth.ok("start", "--ipc", "app", "sh", "-c",
                   f"touch /dev/shm/{name} && ls /dev/shm; "
                   "grep -E ' /dev/(shm|mqueue) ' /proc/self/mounts | cut -d' ' -f2,3 | tail -n 2",
                   env=env)
    lines = out.splitlines()
    assert lines[0] == name  # the only file there: not the host's /dev/shm
    assert not os.path.exists(f"/dev/shm/{name}")
    # the last mounts there: its own, though the host's /dev may have no
    # /dev/mqueue to mount on (this one has none)
    assert lines[1:] == ["/dev/shm tmpfs", "/dev/mqueue mqueue"]
    # without --ipc, the host's
    berth.ok("start", "app", "touch", f"/dev/shm/{name}")
    assert os.path.exists(f"/dev/shm/{name}")
    os.unlink(f"/dev/shm/{name}")


def test_ipc_makes_dev_itself_private(berth, app):
    name = f"bctr-dev-probe-{os.getpid()}"
    out = berth.ok("start", "--root", "--ipc", "app", "sh", "-c",
                   f"touch /dev/{name} && echo made; echo x > /dev/null && readlink /dev/fd; "
                   "test -c /dev/fuse && echo fuse; "
                   "grep ' /dev ' /proc/self/mounts | cut -d' ' -f3")
    # the host's devices and links are there; what the container makes is its own
    assert out.splitlines() == ["made", "/proc/self/fd", "fuse", "tmpfs"]
    assert not os.path.exists(f"/dev/{name}")


@pytest.mark.skipif(not AS_ROOT, reason="masks part of /sys in a mount namespace of its own")
def test_net_falls_back_to_the_hosts_sys_read_only(berth, app):
    """As inside Docker: a path under /sys hidden by a mount makes the kernel
    refuse a fresh sysfs in a user namespace; the start still works."""
    start = shlex.join(map(str, berth.command("start", "--net", "app", "sh", "-c",
                                             "ls /sys/class/net >/dev/null && "
                                             "touch /sys/x 2>/dev/null || echo read-only; "
                                             "cat /proc/net/dev | tail -n +3 | cut -d: -f1")))
    masked = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o ro,size=4k none /sys/firmware && cd {berth.base} && exec {start}"],
        env=berth.env, capture_output=True, text=True, timeout=60, check=False)
    assert masked.returncode == 0, masked.stderr
    assert masked.stdout.split() == ["read-only", "lo"]


@pytest.mark.parametrize("root", [[], ["--root"]])
def test_hooks_keep_the_capabilities_to_mount_into_the_root(berth, app, root):
    """Hooks run as the container's uid in its user namespace; one that is
    not 0 still may mount (nvidia-container-cli does), the command may not."""
    berth.write("cfg/hooks.d/50-mount.sh", """#!/bin/sh
set -e
mount -t tmpfs -o size=1m hooked "$ENROOT_ROOTFS/work"
echo "uid $(id -u) $BERTH_UID" > "$ENROOT_ROOTFS/work/by-hook"
""", mode=0o755)
    uid = "0" if root else str(berth.user.pw_uid)
    out = berth.ok("start", *root, "app", "sh", "-c",
                   "cat /work/by-hook; grep CapEff: /proc/self/status")
    lines = out.splitlines()
    assert lines[0] == f"uid {uid} {uid}"
    cap_eff = int(lines[1].split()[1], 16)
    assert (cap_eff != 0) == bool(root)  # a remapped root has them, a user none


RENAME = """
import os, sys
from berth import syscalls as sc
pid = sys.argv[1]
fds = [(os.open(f"/proc/{pid}/ns/{n}", os.O_RDONLY), f)
       for n, f in (("user", sc.CLONE_NEWUSER), ("mnt", sc.CLONE_NEWNS))]
for fd, flag in fds:
    sc.setns(fd, flag)
try:
    os.rename("/usr/local", "/usr/moved")  # rename(2) itself: mv would copy on EXDEV
    print("renamed", *os.listdir("/usr/moved/bin"))
except OSError as e:
    print(e.strerror)
"""


@pytest.mark.parametrize("mode", ["unpack", "overlay"])
def test_writable_image_start_renames_a_directory_of_the_image(berth, images, mode):
    """dpkg renames what the image shipped; an overlay in a user namespace
    cannot rename a lower directory (EXDEV), so a writable start unpacks."""
    process = subprocess.Popen(berth.command("start", "--detach", "--rw", images / "app.sqsh"),
                               env={**berth.env, "BERTH_WRITABLE_IMAGE": mode}, cwd=berth.base,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.strip().isdigit(), process.stderr.read()
    pid = int(line)
    try:
        prefix = ["runuser", "-u", berth.user.pw_name, "--"] if AS_ROOT else []
        result = subprocess.run([*prefix, "/usr/bin/python3", "-c", RENAME, str(pid)],
                                env=berth.env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        expected = "renamed only-in-image" if mode == "unpack" else "Invalid cross-device link"
        assert result.stdout.strip() == expected
        if mode == "unpack":  # the container sees it moved
            assert berth.ok("exec", pid, "ls", "/usr/moved/bin") == "only-in-image\n"
    finally:
        process.stdin.close()
        assert process.wait(timeout=20) == 0
    assert berth.leftovers() == []  # the unpacked root went with the container


def test_writable_image_mode_is_checked(berth, images):
    berth.fails("start", "--rw", images / "app.sqsh", "true", env={"BERTH_WRITABLE_IMAGE": "copy"},
                needle="BERTH_WRITABLE_IMAGE: expected unpack or overlay, got 'copy'")
    # a read-only start never unpacks: the image stays mounted
    out = berth.ok("start", images / "app.sqsh", "sh", "-c", "grep -c squashfuse /proc/mounts")
    assert int(out) >= 1


def test_unpacked_root_of_a_killed_start_is_removed_by_the_next(berth, images):
    process, pid = start_detached(berth, "--rw", images / "app.sqsh")
    os.kill(berth_pid(process), signal.SIGKILL)  # no teardown at all
    process.wait(timeout=10)
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    data = berth.base / "data"
    assert [p.name.startswith("..rw.app.sqsh.") for p in data.iterdir()] == [True]
    # a live one is left alone, the abandoned one goes
    live, live_pid = start_detached(berth, "--rw", images / "app.sqsh")
    try:
        names = [p.name for p in data.iterdir()]
        assert len(names) == 1 and names[0].startswith("..rw.app.sqsh.")
        assert berth.ok("start", "--rw", images / "app.sqsh", "true") == ""
        assert [p.name for p in data.iterdir()] == names
    finally:
        live.stdin.close()
        assert live.wait(timeout=20) == 0
    assert list(data.iterdir()) == []


DEBIAN_IMAGE = Path(__file__).resolve().parents[2] / ".cache/images/bookworm/mpi-test.sqsh"


@pytest.fixture
def probe_deb(berth):
    """A tiny package whose files dpkg chowns to root and whose postinst
    changes owners and groups, as openssh-client's and many others' do."""
    if not shutil.which("dpkg-deb"):
        pytest.skip("needs dpkg-deb")
    tree = berth.base / "host/pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "usr/share/bctr-probe").mkdir(parents=True)
    (tree / "usr/share/bctr-probe/tool").write_text("#!/bin/sh\necho probe\n")
    (tree / "DEBIAN/control").write_text(
        "Package: bctr-probe\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: Berth tests <tests@example.org>\nDescription: seccomp probe\n")
    (tree / "DEBIAN/postinst").write_text(
        "#!/bin/sh\nset -e\nchown root:root /usr/share/bctr-probe/tool\n"
        "chgrp 42 /usr/share/bctr-probe/tool\nchmod 2755 /usr/share/bctr-probe/tool\n")
    (tree / "DEBIAN/postinst").chmod(0o755)
    deb = berth.base / "host/bctr-probe.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True)
    shutil.rmtree(tree)
    berth.chown(berth.base / "host")
    return deb


@pytest.mark.skipif(not DEBIAN_IMAGE.exists(), reason="needs scripts/test-image.sh's image")
@pytest.mark.parametrize("mode", ["unpack", "overlay"])
def test_dpkg_installs_a_package_whose_scripts_chown(berth, probe_deb, mode):
    """As a remapped root (dpkg wants uid 0), in a writable start of an image.
    Over an overlay in a user namespace dpkg fails even to put a new
    directory in place (its X.dpkg-new renamed to X): EXDEV."""
    image = berth.base / "host/debian.sqsh"
    shutil.copy(DEBIAN_IMAGE, image)
    berth.chown(image)
    result = berth("start", "--rw", "--root", "-m", f"{probe_deb}:/tmp/probe.deb", image,
                   "sh", "-c", "dpkg -i /tmp/probe.deb >/dev/null && "
                   "dpkg -s bctr-probe | grep ^Status && /usr/share/bctr-probe/tool",
                   timeout=300, env={"BERTH_WRITABLE_IMAGE": mode})
    if mode == "unpack":
        assert result.returncode == 0, result.stderr
        assert result.stdout == "Status: install ok installed\nprobe\n"
    else:
        assert result.returncode == 1 and "Invalid cross-device link" in result.stderr
    assert berth.leftovers() == []
