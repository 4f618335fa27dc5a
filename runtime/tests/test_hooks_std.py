"""The standard hooks in hooks/ (10-*.sh), run by real starts."""

import grp
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from container_fixture import AS_ROOT

HOOKS = Path(__file__).resolve().parents[2] / "hooks"


@pytest.fixture
def hooked(berth):
    """`berth` with the standard hooks installed in its system hooks.d."""
    target = berth.base / "sys/hooks.d"
    target.mkdir(parents=True)
    for hook in HOOKS.glob("10-*.sh"):
        shutil.copy(hook, target / hook.name)
    berth.chown(target)
    return berth


def test_shadow_adds_the_caller_without_touching_the_image(hooked, app):
    name = hooked.user.pw_name
    group = grp.getgrgid(hooked.user.pw_gid).gr_name
    (app / "etc/group").write_text("root:x:0:\n")
    before = (app / "etc/passwd").read_text()
    out = hooked.ok("start", "app", "sh", "-c", "id -un; id -gn; tail -1 /etc/passwd")
    who, group_inside, entry = out.splitlines()
    assert (who, group_inside) == (name, group)
    assert entry.startswith(f"{name}:x:{hooked.user.pw_uid}:") and entry.endswith(":/bin/sh")
    assert (app / "etc/passwd").read_text() == before
    assert (app / "etc/group").read_text() == "root:x:0:\n"
    assert hooked.ok("start", "--root", "app", "cat", "/etc/passwd") == before  # root is known


def test_shadow_matches_the_id_field_only_and_keeps_lines_whole(hooked, app):
    uid = hooked.user.pw_uid
    # The caller's uid only as another entry's gid, and no final newline.
    passwd = f"root:x:0:0:root:/root:/bin/sh\nsvc:x:999:{uid}::/:/bin/sh"
    (app / "etc/passwd").write_text(passwd)
    out = hooked.ok("start", "app", "cat", "/etc/passwd").splitlines()
    assert out[:2] == passwd.splitlines()
    assert out[2].startswith(f"{hooked.user.pw_name}:x:{uid}:")


def test_home_only_with_mount_home(hooked, app):
    home = hooked.user.pw_dir
    probe = Path(home, ".bctr-home-probe")
    probe.write_text("home\n")
    try:
        out = hooked.ok("start", "app", "sh", "-c", "echo $HOME; cat ~/.bctr-home-probe",
                        env={"ENROOT_MOUNT_HOME": "yes"})
        assert out == f"{home}\nhome\n"
        result = hooked("start", "app", "cat", f"{home}/.bctr-home-probe")
        assert result.returncode == 1  # not mounted by default
    finally:
        probe.unlink()


def test_localtime_is_the_hosts(hooked, app, images):
    if not os.path.exists("/etc/localtime"):
        pytest.skip("host has no /etc/localtime")
    host = hashlib.md5(Path("/etc/localtime").read_bytes()).hexdigest()
    assert hooked.ok("start", "app", "md5sum", "/etc/localtime").split()[0] == host
    # A read-only image without /etc/localtime still starts (nofail).
    assert hooked.ok("start", images / "app.sqsh", "true") == ""


def test_restricted_dev_is_minimal(hooked, app):
    listing = hooked.ok("start", "app", "ls", "/dev", env={"ENROOT_RESTRICT_DEV": "yes"}).split()
    assert {"null", "zero", "urandom", "tty", "pts", "shm"} <= set(listing)
    assert "fuse" not in listing and "fuse" in os.listdir("/dev")
    assert "fuse" in hooked.ok("start", "app", "ls", "/dev").split()


@pytest.mark.skipif(not AS_ROOT or not os.path.exists("/sys/fs/cgroup/devices/devices.list"),
                    reason="needs root and the cgroup v1 devices controller")
def test_devices_hook_follows_the_device_cgroup(tmp_path):
    """10-devices.sh alone, with a devices.list bound over the real one."""
    rules = tmp_path / "devices.list"
    rules.write_text("c 1:3 rwm\nb 7:* rwm\n")  # /dev/null only; block rules ignored
    mounts = tmp_path / "mounts"
    mounts.write_text("")
    cgroup = next(line.split(":")[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                  if "devices" in line.split(":")[1].split(","))
    script = (f"mount --bind {rules} /sys/fs/cgroup/devices{cgroup}/devices.list && "
              f"exec {HOOKS}/10-devices.sh")
    subprocess.run(["unshare", "-m", "sh", "-c", script], check=True,
                   env={"PATH": os.environ["PATH"], "ENROOT_RESTRICT_DEV": "yes",
                        "ENROOT_MOUNTS": str(mounts)})
    assert mounts.read_text() == "/dev/null /dev/null none bind,x-create=file,nofail\n"


def test_aptfix_only_for_a_remapped_root_with_apt(hooked, app):
    (app / "etc/apt/apt.conf.d").mkdir(parents=True)
    hooked.chown(app / "etc/apt")
    conf = "/etc/apt/apt.conf.d/00berth-sandbox"
    assert hooked.ok("start", "--root", "app", "cat", conf) == 'APT::Sandbox::User "root";\n'
    # Unmapped, the placeholder x-create left in the container stays empty.
    assert hooked.ok("start", "app", "cat", conf) == ""


def test_shipped_hooks_never_act_on_the_images_variables(berth):
    """Every shipped hook (bash ones included) under an image whose Env holds a
    BASH_ENV payload and loader variables: the start works, nothing of it runs
    on the host side, and the container keeps its variables."""
    from container_fixture import create_with_env
    target = berth.base / "sys/hooks.d"
    target.mkdir(parents=True)
    for hook in [*HOOKS.glob("*.sh"), HOOKS / "common.bash", HOOKS / "nvidia-libraries.conf"]:
        shutil.copy(hook, target / hook.name)
    berth.chown(target)
    marker = berth.base / "host/payload-ran"
    env = [f"BASH_ENV=$(touch {marker})", f"ENV=$(touch {marker})", "LD_PRELOAD=/no/evil.so",
           "LD_LIBRARY_PATH=/evil/lib", "PATH=/evil/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    create_with_env(berth, "evil", env)
    result = berth("start", "evil", "/bin/sh", "-c", 'echo "$LD_LIBRARY_PATH"')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "/evil/lib\n"
    assert "evil.so" not in result.stderr
    assert not marker.exists(), "the image's BASH_ENV ran in a hook"
