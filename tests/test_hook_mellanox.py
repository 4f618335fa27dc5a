"""hooks/91-mellanox.sh against a fabricated RDMA stack.

The fixtures stand in for a node with real HCAs: sysfs trees recorded in the
kernel's layout (tests/fixtures/gpu/*/sys/class/infiniband: a DGX with eight
mlx5 HCAs, a node with one RoCE bond whose verbs device is uverbs3), device
nodes made with mknod in a temporary /dev/infiniband, placeholder library
files listed by a canned `ldconfig -p` (the test machine has no rdma-core),
and an /etc/libibverbs.d. The tests read the lines the hook appended.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "hooks" / "91-mellanox.sh"
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
DEVICE_OPTIONS = "none bind,nosuid,noexec,x-create=file"
LIBRARY_OPTIONS = "none bind,ro,nosuid,x-create=file"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of device nodes needs root")


def make_dev(dev, without=()):
    """/dev/infiniband of a node whose verbs devices are uverbs0..7, as mknod makes them."""
    ib = dev / "infiniband"
    ib.mkdir(parents=True)
    nodes = {"rdma_cm": (10, 58)}
    for n in range(8):
        nodes.update({f"uverbs{n}": (231, 192 + n), f"umad{n}": (231, n), f"issm{n}": (231, 64 + n)})
    for name, (major, minor) in nodes.items():
        if name not in without:
            os.mknod(ib / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return dev


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host's verbs stack: libraries, providers, cache listing, config dir, /dev."""
    root = tmp_path_factory.mktemp("rdma")
    libdir = root / "lib64"
    (libdir / "libibverbs").mkdir(parents=True)
    files = {
        "libibverbs.so.1.14.50.0": "libibverbs.so.1",
        "librdmacm.so.1.3.50.0": "librdmacm.so.1",
        "libmlx5.so.1.24.50.0": "libmlx5.so.1",
        "libnl-3.so.200.26.0": "libnl-3.so.200",
        "libz.so.1.2.13": "libz.so.1",
    }
    listing = ["5 libs found in cache `/etc/ld.so.cache'"]
    for real, soname in files.items():
        (libdir / real).write_text("placeholder\n")
        (libdir / soname).symlink_to(real)
        listing.append(f"\t{soname} (libc6,x86-64) => {libdir / soname}")
    # a 32-bit entry that must not be bound
    listing.append(f"\tlibibverbs.so.1 (libc6) => {libdir / 'libibverbs.so.1'}")
    # providers are links back to the library, as rdma-core installs them
    (libdir / "libibverbs" / "libmlx5-rdmav34.so").symlink_to("../libmlx5.so.1.24.50.0")
    (libdir / "libibverbs" / "libefa-rdmav34.so").symlink_to("../libz.so.1.2.13")
    cache = root / "ldconfig-p.txt"
    cache.write_text("\n".join(listing) + "\n")
    etc = root / "etc"
    (etc / "libibverbs.d").mkdir(parents=True)
    (etc / "libibverbs.d" / "mlx5.driver").write_text("driver mlx5\n")
    return {"libdir": libdir, "cache": cache, "etc": etc, "dev": make_dev(root / "dev")}


def container_lines(env):
    """Split `env` as the runtime does: the container's variables are lines of
    $ENROOT_ENVIRON, data; the rest is the caller's, the hook's environment."""
    inside = {k: env.pop(k) for k in list(env) if k.startswith("MELLANOX_") or k == "LD_LIBRARY_PATH"}
    return [f"{k}={v}" for k, v in inside.items()]


def run_hook(host, tmp_path, env=None, tree="dgx-h100", earlier_environ=None, caller=None):
    """Run the hook as the runtime does; return (process, mounts, environ) it appended.
    `env` holds the container's variables and the caller's knobs; `caller`
    only the caller's environment."""
    mounts = tmp_path / "mounts"
    environ = tmp_path / "environ"
    env = dict(env or {})
    view = container_lines(env)
    # Earlier hooks' lines: the hook must append after them, never rewrite.
    mounts.write_text("/earlier /earlier none bind\n")
    environ.write_text("".join(f"{line}\n" for line in view) + "EARLIER=1\n"
                       + (f"{earlier_environ}\n" if earlier_environ else ""))
    full_env = {
        "PATH": "/usr/bin:/bin",
        "ENROOT_PID": "4242",
        "ENROOT_ROOTFS": str(tmp_path),
        "ENROOT_MOUNTS": str(mounts),
        "ENROOT_ENVIRON": str(environ),
        "BERTH_SYS_ROOT": str(FIXTURES / tree / "sys" if tree else tmp_path / "no-sys"),
        "BERTH_DEV_ROOT": str(host["dev"]),
        "BERTH_ETC_ROOT": str(host["etc"]),
        "BERTH_LDCONFIG": f"cat {host['cache']}",
    }
    full_env.update(env)
    full_env.update(caller or {})
    proc = subprocess.run([HOOK], env=full_env, capture_output=True, text=True, timeout=30)
    appended = mounts.read_text().splitlines()
    added_env = environ.read_text().splitlines()[len(view):]
    assert appended[0] == "/earlier /earlier none bind" and added_env[0] == "EARLIER=1"
    return proc, appended[1:], added_env[1:]


def devices(mounts):
    return sorted(line.split()[1] for line in mounts if line.split()[1].startswith("/dev/"))


def dev_line(host, node):
    return f"{host['dev']}/infiniband/{node} /dev/infiniband/{node} {DEVICE_OPTIONS}"


@pytest.mark.parametrize("value", [None, "", "none", "void"])
def test_nothing_requested_binds_nothing(host, tmp_path, value):
    env = {} if value is None else {"MELLANOX_VISIBLE_DEVICES": value}
    proc, mounts, environ = run_hook(host, tmp_path, env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert mounts == [] and environ == []


@pytest.mark.parametrize("value", ["0", "no", "False"])
def test_edf_annotation_switches_the_hook_off(host, tmp_path, value):
    """0 (an EDF's false), and no or false as the other hooks' switches take."""
    env = {"MELLANOX_VISIBLE_DEVICES": "all", "BERTH_HOOK_MELLANOX_ENABLE": value}
    proc, mounts, environ = run_hook(host, tmp_path, env)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []
    proc, mounts, _ = run_hook(host, tmp_path, env | {"BERTH_HOOK_MELLANOX_ENABLE": "1"})
    assert proc.returncode == 0 and mounts


def test_all_on_a_node_without_hcas_binds_nothing(host, tmp_path):
    proc, mounts, environ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "all"}, tree=None)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []


def test_all_binds_every_hca_libraries_and_config(host, tmp_path):
    proc, mounts, environ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "all"})
    assert proc.returncode == 0, proc.stderr
    expected = ["/dev/infiniband/rdma_cm"] + [
        f"/dev/infiniband/{kind}{n}" for n in range(8) for kind in ("uverbs", "umad", "issm")
    ]
    assert devices(mounts) == sorted(expected)
    libdir = host["libdir"]
    assert f"{libdir}/libibverbs.so.1.14.50.0 /usr/local/rdma/lib64/libibverbs.so.1 {LIBRARY_OPTIONS}" in mounts
    assert f"{libdir}/libmlx5.so.1.24.50.0 /usr/local/rdma/lib64/libmlx5.so.1 {LIBRARY_OPTIONS}" in mounts
    # the mlx provider under its plugin name, resolved; not other providers
    assert f"{libdir}/libmlx5.so.1.24.50.0 /usr/local/rdma/lib64/libmlx5-rdmav34.so {LIBRARY_OPTIONS}" in mounts
    names = [line.split()[1].rsplit("/", 1)[1] for line in mounts]
    assert "libefa-rdmav34.so" not in names and "libz.so.1" not in names
    assert names.count("libibverbs.so.1") == 1  # the 32-bit entry is not bound
    assert f"{host['etc']}/libibverbs.d /etc/libibverbs.d none bind,ro,nosuid,nodev,noexec,x-create=dir" in mounts
    assert environ == ["LD_LIBRARY_PATH=/usr/local/rdma/lib64"]


def test_names_and_indices_select_those_hcas(host, tmp_path):
    proc, mounts, _ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "mlx5_6, 2"})
    assert proc.returncode == 0, proc.stderr
    assert [d for d in devices(mounts) if "uverbs" in d] == ["/dev/infiniband/uverbs2", "/dev/infiniband/uverbs6"]
    assert dev_line(host, "umad6") in mounts


def test_verbs_node_comes_from_sysfs_not_the_name(host, tmp_path):
    # two-a100's only HCA, mlx5_bond_0, is uverbs3.
    proc, mounts, _ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "0"}, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    assert [d for d in devices(mounts) if "uverbs" in d] == ["/dev/infiniband/uverbs3"]


def test_after_the_nvidia_hook_the_library_path_keeps_its_directory(host, tmp_path):
    env = {"MELLANOX_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": "/opt/lib"}
    proc, _, added = run_hook(host, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert added == ["LD_LIBRARY_PATH=/usr/local/rdma/lib64:/opt/lib"]
    # The NVIDIA hook ran first and left its line: build on it, not on the image's.
    earlier = "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/opt/lib"
    proc, _, added = run_hook(host, tmp_path, env, earlier_environ=earlier)
    assert proc.returncode == 0, proc.stderr
    assert added == [earlier, "LD_LIBRARY_PATH=/usr/local/rdma/lib64:/usr/local/nvidia/lib64:/opt/lib"]


@pytest.mark.parametrize("value, named", [
    ("8", "8"), ("1234567890123456789012", "1234567890123456789012"), ("mlx5_9", "mlx5_9"),
    ("../../etc", "../../etc"), ("..", "'..'"),
])
def test_bad_hca_is_refused_and_nothing_appended(host, tmp_path, value, named):
    proc, mounts, environ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": f"0,{value}"})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "MELLANOX_VISIBLE_DEVICES" in lines[0] and named in lines[0]
    assert mounts == [] and environ == []


def test_missing_verbs_node_is_named(host, tmp_path):
    dev = make_dev(tmp_path / "dev", without=["uverbs5"])
    env = {"MELLANOX_VISIBLE_DEVICES": "all", "BERTH_DEV_ROOT": str(dev)}
    proc, mounts, environ = run_hook(host, tmp_path, env)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"mellanox hook: {dev}/infiniband/uverbs5: HCA mlx5_5's verbs device node is missing"
    assert mounts == [] and environ == []


def test_failing_ldconfig_is_refused(host, tmp_path):
    env = {"MELLANOX_VISIBLE_DEVICES": "all", "BERTH_LDCONFIG": "false"}
    proc, mounts, environ = run_hook(host, tmp_path, env)
    assert proc.returncode != 0 and "BERTH_LDCONFIG" in proc.stderr
    assert mounts == [] and environ == []


def test_reads_the_container_view_not_its_own_environment(host, tmp_path):
    """The runtime runs hooks in the caller's environment: a MELLANOX_VISIBLE_DEVICES
    or LD_LIBRARY_PATH there is the host's, not the container's, and is not used."""
    caller = {"MELLANOX_VISIBLE_DEVICES": "all", "LD_LIBRARY_PATH": "/host/lib"}
    proc, mounts, environ = run_hook(host, tmp_path, caller=caller)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []
    proc, mounts, environ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "mlx5_0"},
                                     caller=caller)
    assert proc.returncode == 0, proc.stderr
    assert devices(mounts) == ["/dev/infiniband/issm0", "/dev/infiniband/rdma_cm",
                               "/dev/infiniband/umad0", "/dev/infiniband/uverbs0"]
    assert environ == ["LD_LIBRARY_PATH=/usr/local/rdma/lib64"]


def test_the_last_container_value_wins_and_odd_lines_are_data(host, tmp_path):
    """An earlier hook's line overrides the image's; lines that are not
    KEY=VALUE, or that look like shell, are never run."""
    marker = tmp_path / "ran"
    earlier = "\n".join([f"$(touch {marker})", f"MELLANOX_VISIBLE_DEVICES_X=$(touch {marker})",
                         "MELLANOX_VISIBLE_DEVICES=none"])
    proc, mounts, _ = run_hook(host, tmp_path, {"MELLANOX_VISIBLE_DEVICES": "all"},
                               earlier_environ=earlier)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and not marker.exists()
