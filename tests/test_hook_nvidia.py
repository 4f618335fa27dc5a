"""hooks/90-nvidia.sh against a fabricated driver install.

The fixtures stand in for a real GPU node: procfs trees recorded in the
driver's format (tests/fixtures/gpu/*/proc), device nodes made with mknod in a
temporary /dev, tiny stub shared libraries named like the driver's and
registered in a test ld.so cache built by ldconfig, and an nvidia-smi
stand-in that prints canned output. The hook is run exactly as the runtime
runs it; the tests read the mount and environment lines it appended.
"""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "hooks" / "90-nvidia.sh"
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
DRIVER_VERSION = "550.54.15"
UUID_GPU1_TWO_A100 = "GPU-bbbbbbbb-0000-1111-2222-333333333333"
MIG_ON_GPU1 = "MIG-dddddddd-0000-1111-2222-333333333333"
DEVICE_OPTIONS = "none bind,nosuid,noexec,x-create=file"
LIBRARY_OPTIONS = "none bind,ro,nosuid,x-create=file"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of device nodes needs root")

# (file name, soname): a driver's libraries for several capabilities, and one
# library that is not the driver's and must never be bound.
STUB_LIBRARIES = [
    (f"libcuda.so.{DRIVER_VERSION}", "libcuda.so.1"),
    (f"libnvidia-ml.so.{DRIVER_VERSION}", "libnvidia-ml.so.1"),
    (f"libnvidia-ptxjitcompiler.so.{DRIVER_VERSION}", "libnvidia-ptxjitcompiler.so.1"),
    (f"libnvcuvid.so.{DRIVER_VERSION}", "libnvcuvid.so.1"),
    (f"libGLX_nvidia.so.{DRIVER_VERSION}", "libGLX_nvidia.so.0"),
    ("libcudart-not-driver.so.12.4.99", "libcudart-not-driver.so.12"),
    ("libgdrapi.so.2.4", "libgdrapi.so.2"),  # GDRCopy's: bound only beside /dev/gdrdrv
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """A host driver install: libraries + ld.so cache, programs, /dev nodes."""
    root = tmp_path_factory.mktemp("driver")
    libdir = root / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    source = root / "stub.c"
    source.write_text("int berth_stub(void) { return 0; }\n")
    for name, soname in STUB_LIBRARIES:
        subprocess.run(
            ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", libdir / name, source],
            check=True,
        )
    conf = root / "ld.so.conf"
    conf.write_text(f"{libdir}\n")
    cache = root / "ld.so.cache"
    subprocess.run(["ldconfig", "-C", cache, "-f", conf], check=True)

    bindir = root / "bin"
    bindir.mkdir()
    for program in ("nvidia-cuda-mps-control", "nvidia-debugdump"):
        (bindir / program).write_text("#!/bin/sh\nexit 0\n")
        (bindir / program).chmod(0o755)

    return {"root": root, "libdir": libdir, "cache": cache, "bin": bindir, "dev": make_dev(root / "dev")}


def make_dev(dev, without=()):
    """A /dev with the driver's nodes of an 8-GPU node, less those named."""
    nodes = {f"nvidia{minor}": (195, minor) for minor in range(8)}
    nodes.update({"nvidiactl": (195, 255), "nvidia-uvm": (510, 0), "nvidia-uvm-tools": (510, 1)})
    (dev / "nvidia-caps").mkdir(parents=True)
    for name, (major, minor) in nodes.items():
        if name not in without:
            os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return dev


def run_hook(driver, tmp_path, env=None, tree="dgx-h100", extra_path=()):
    """Run the hook as the runtime does; return (process, mounts, environ).
    The container's variables in `env` (NVIDIA_*, LD_LIBRARY_PATH) become
    lines of $ENROOT_ENVIRON, as the runtime passes them; the rest is the
    caller's environment, the hook's own."""
    mounts = tmp_path / "mounts"
    environ = tmp_path / "environ"
    env = dict(env or {})
    view = [f"{k}={env.pop(k)}" for k in list(env)
            if k.startswith("NVIDIA_") or k == "LD_LIBRARY_PATH"]
    # Earlier hooks' lines: the hook must append after them, never rewrite.
    mounts.write_text("/earlier /earlier none bind\n")
    environ.write_text("".join(f"{line}\n" for line in view) + "EARLIER=1\n")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    tree_dir = FIXTURES / tree if tree else tmp_path / "no-gpu"
    path = [*map(str, extra_path), str(tree_dir / "bin"), str(driver["bin"]), "/usr/bin", "/bin"]
    full_env = {
        "PATH": ":".join(path),
        "ENROOT_PID": "4242",
        "ENROOT_ROOTFS": str(rootfs),
        "ENROOT_MOUNTS": str(mounts),
        "ENROOT_ENVIRON": str(environ),
        "BERTH_PROC_ROOT": str(tree_dir / "proc"),
        "BERTH_DEV_ROOT": str(driver["dev"]),
        "BERTH_LDCONFIG": f"ldconfig -C {driver['cache']} -p",
    }
    full_env.update(env)
    proc = subprocess.run([HOOK], env=full_env, capture_output=True, text=True, timeout=30)
    appended = mounts.read_text().splitlines()
    assert appended[0] == "/earlier /earlier none bind"
    added_env = environ.read_text().splitlines()[len(view):]
    assert added_env[0] == "EARLIER=1"
    return proc, appended[1:], added_env[1:]


def device_line(driver, node):
    return f"{driver['dev']}/{node} /dev/{node} {DEVICE_OPTIONS}"


def library_line(driver, file_name, entry, libdir="/usr/local/nvidia/lib64"):
    return f"{driver['libdir']}/{file_name} {libdir}/{entry} {LIBRARY_OPTIONS}"


def bound_devices(mounts):
    return sorted(line.split()[1] for line in mounts if line.split()[1].startswith("/dev/"))


def bound_names(mounts):
    return sorted(line.split()[1].rsplit("/", 1)[1] for line in mounts)


def assert_refused(proc, mounts, environ, *names):
    """A refusal: one stderr line naming the bad value, nothing appended."""
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for name in names:
        assert name in lines[0]
    assert mounts == [] and environ == []


@pytest.mark.parametrize("value", [None, "", "none", "void"])
def test_nothing_requested_binds_nothing(driver, tmp_path, value):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert mounts == [] and environ == []


@pytest.mark.parametrize("value", ["0", "no", "False"])
def test_edf_annotation_switches_the_hook_off(driver, tmp_path, value):
    """0 (an EDF's false), and no or false as the other hooks' switches take."""
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "BERTH_HOOK_NVIDIA_ENABLE": value}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []
    proc, mounts, _ = run_hook(driver, tmp_path, env | {"BERTH_HOOK_NVIDIA_ENABLE": "1"})
    assert proc.returncode == 0 and mounts


def test_all_on_a_node_without_gpus_is_a_cpu_container(driver, tmp_path):
    proc, mounts, environ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "all"}, tree=None)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []


def test_all_binds_every_gpu_with_default_capabilities(driver, tmp_path):
    proc, mounts, environ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert proc.returncode == 0, proc.stderr
    assert bound_devices(mounts) == sorted(
        [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    )
    assert device_line(driver, "nvidia3") in mounts
    # compute + utility: each soname entry bound from the real file;
    # video/graphics and non-driver libraries not.
    assert library_line(driver, f"libcuda.so.{DRIVER_VERSION}", "libcuda.so.1") in mounts
    assert library_line(driver, f"libnvidia-ml.so.{DRIVER_VERSION}", "libnvidia-ml.so.1") in mounts
    libraries = [line.split()[1] for line in mounts if "/usr/local/nvidia/" in line]
    assert sorted(p.rsplit("/", 1)[1] for p in libraries) == [
        "libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
    ]
    # programs: from PATH, into /usr/bin
    smi = FIXTURES / "dgx-h100" / "bin" / "nvidia-smi"
    assert f"{smi} /usr/bin/nvidia-smi {LIBRARY_OPTIONS}" in mounts
    assert f"{driver['bin']}/nvidia-cuda-mps-control /usr/bin/nvidia-cuda-mps-control {LIBRARY_OPTIONS}" in mounts
    assert environ == ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]


def test_image_library_path_is_kept_behind_the_driver(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": "/opt/app/lib"}
    proc, _, environ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert environ == ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/opt/app/lib"]


def test_cuda_image_library_path_already_has_the_directory(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0 and mounts
    assert environ == []


def test_index_maps_to_the_minor_number_not_the_same_digit(driver, tmp_path):
    # two-a100: GPU index 0 (first on the bus) has minor 1.
    proc, mounts, _ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    assert device_line(driver, "nvidia1") in mounts
    assert "/dev/nvidia0" not in bound_devices(mounts)


def test_uuid_selects_its_gpu(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": UUID_GPU1_TWO_A100.upper()}
    proc, mounts, _ = run_hook(driver, tmp_path, env, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    assert [d for d in bound_devices(mounts) if d[-1].isdigit()] == ["/dev/nvidia0"]


def test_list_of_indices_selects_those_only(driver, tmp_path):
    proc, mounts, environ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "2, 5"})
    assert proc.returncode == 0, proc.stderr
    assert [d for d in bound_devices(mounts) if d[-1].isdigit()] == ["/dev/nvidia2", "/dev/nvidia5"]
    assert not any(line.startswith("CUDA_VISIBLE_DEVICES=") for line in environ)


@pytest.mark.parametrize(
    "value, named",
    [
        ("0,8", "8"),
        ("99999999999999999999999", "99999999999999999999999"),
        ("GPU-1234", "GPU-1234"),
        ("GPU-ffffffff-0000-1111-2222-333333333333", "GPU-ffffffff-0000-1111-2222-333333333333"),
        ("MIG-ffffffff-0000-1111-2222-333333333333", "MIG-ffffffff"),
        ("first", "first"),
    ],
)
def test_bad_device_is_refused_and_nothing_appended(driver, tmp_path, value, named):
    proc, mounts, environ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": value})
    assert_refused(proc, mounts, environ, "NVIDIA_VISIBLE_DEVICES", named)


def test_unknown_capability_is_refused(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,magic"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, "NVIDIA_DRIVER_CAPABILITIES", "'magic'")


def test_capabilities_select_libraries(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video"}
    proc, mounts, _ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    names = bound_names(mounts)
    assert "libnvcuvid.so.1" in names
    assert "libcuda.so.1" not in names and "nvidia-smi" not in names

    env["NVIDIA_DRIVER_CAPABILITIES"] = "all"
    proc, mounts, _ = run_hook(driver, tmp_path, env)
    names = bound_names(mounts)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvcuvid.so.1", "libGLX_nvidia.so.0", "nvidia-smi"):
        assert name in names
    assert not any("not-driver" in line for line in mounts)


def test_compat32_binds_32bit_entries_into_lib(driver, tmp_path):
    # ldconfig here builds 64-bit stubs only; a canned cache listing shows a
    # 32-bit entry (flags "libc6") the way a multilib host's ldconfig -p does.
    listing = tmp_path / "ldconfig-p.txt"
    lib = driver["libdir"] / f"libcuda.so.{DRIVER_VERSION}"
    listing.write_text(
        "2 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {lib}\n"
        f"\tlibcuda.so.1 (libc6) => {lib}\n"
    )
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_LDCONFIG": f"cat {listing}"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert [line for line in mounts if "/usr/local/nvidia/lib/" in line] == []
    env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,compat32"
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert library_line(driver, lib.name, "libcuda.so.1", "/usr/local/nvidia/lib") in mounts
    assert library_line(driver, lib.name, "libcuda.so.1") in mounts
    assert environ == ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"]


def test_host_ld_cache_is_read_by_default(driver, tmp_path):
    # The real `ldconfig -p` of this machine: it has no NVIDIA driver, so no
    # library is bound, but devices are and nothing fails.
    env = {"NVIDIA_VISIBLE_DEVICES": "1"}
    proc, mounts, _ = run_hook(driver, tmp_path, env | {"BERTH_LDCONFIG": ""})
    assert proc.returncode == 0, proc.stderr
    assert device_line(driver, "nvidia1") in mounts
    assert not any("/usr/local/nvidia/lib64/libcuda" in line for line in mounts)


@pytest.fixture
def shared_dir():
    """A directory an ordinary user can read (pytest's own tmp is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="berth-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_runs_as_an_ordinary_user_without_sbin_on_path(shared_dir):
    # The runtime runs hooks as the user. A world-readable copy of the hook
    # and a driver tree; PATH without sbin, where Debian keeps ldconfig.
    root = shared_dir
    hooks = root / "hooks"
    shutil.copytree(REPO / "hooks", hooks)
    shutil.copytree(FIXTURES / "two-a100" / "proc", root / "proc")
    dev = make_dev(root / "dev")
    for name in ("mounts", "environ"):
        (root / name).touch(mode=0o666)
        (root / name).chmod(0o666)
    (root / "environ").write_text("NVIDIA_VISIBLE_DEVICES=all\n")  # the container's
    env = {"PATH": "/usr/bin:/bin", "ENROOT_PID": "1",
           "ENROOT_ROOTFS": "/", "ENROOT_MOUNTS": str(root / "mounts"), "ENROOT_ENVIRON": str(root / "environ"),
           "BERTH_PROC_ROOT": str(root / "proc"), "BERTH_DEV_ROOT": str(dev)}
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", hooks / "90-nvidia.sh"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (root / "mounts").read_text().splitlines()[:2] == [
        f"{dev}/nvidia1 /dev/nvidia1 {DEVICE_OPTIONS}", f"{dev}/nvidia0 /dev/nvidia0 {DEVICE_OPTIONS}"]
    assert (root / "environ").read_text() == ("NVIDIA_VISIBLE_DEVICES=all\n"
                                              "LD_LIBRARY_PATH=/usr/local/nvidia/lib64\n")


def test_failing_ldconfig_is_refused(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_LDCONFIG": "false"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, "BERTH_LDCONFIG")


def test_slurm_binding_when_unset_and_renumbered_inside(driver, tmp_path):
    env = {"SLURM_STEP_GPUS": "3,6", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "3,6"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert [d for d in bound_devices(mounts) if d[-1].isdigit()] == ["/dev/nvidia3", "/dev/nvidia6"]
    assert "CUDA_VISIBLE_DEVICES=0,1" in environ


def test_all_is_narrowed_to_the_jobs_gpus(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_JOB_GPUS": "5"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert [d for d in bound_devices(mounts) if d[-1].isdigit()] == ["/dev/nvidia5"]
    assert "CUDA_VISIBLE_DEVICES=0" in environ


@pytest.mark.parametrize("binding", [{"SLURM_JOB_GPUS": "0"}, {"CUDA_VISIBLE_DEVICES": "0,1"}])
def test_cuda_image_with_a_binding_on_a_cpu_node_runs(driver, tmp_path, binding):
    env = {"NVIDIA_VISIBLE_DEVICES": "all"} | binding
    proc, mounts, environ = run_hook(driver, tmp_path, env, tree=None)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []


@pytest.mark.parametrize("hidden", ["-1", "NoDevFiles"])
def test_cuda_visible_devices_hiding_every_gpu_binds_none(driver, tmp_path, hidden):
    proc, mounts, environ = run_hook(driver, tmp_path, {"CUDA_VISIBLE_DEVICES": hidden})
    assert (proc.returncode, proc.stderr) == (0, "")
    assert mounts == [] and environ == []


def test_bad_slurm_binding_names_the_variable(driver, tmp_path):
    proc, mounts, environ = run_hook(driver, tmp_path, {"SLURM_STEP_GPUS": "0,9"})
    assert_refused(proc, mounts, environ, "SLURM_STEP_GPUS", "9")


def test_mig_device_binds_its_parent_and_the_caps(driver, tmp_path):
    proc, mounts, environ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": MIG_ON_GPU1}, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    # GPU 1 of two-a100 has minor 0
    assert [d for d in bound_devices(mounts) if d[-1].isdigit()] == ["/dev/nvidia0"]
    assert f"{driver['dev']}/nvidia-caps /dev/nvidia-caps none bind,nosuid,noexec,x-create=dir" in mounts


def test_mig_from_slurm_is_passed_by_uuid(driver, tmp_path):
    proc, _, environ = run_hook(driver, tmp_path, {"CUDA_VISIBLE_DEVICES": MIG_ON_GPU1}, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA_VISIBLE_DEVICES={MIG_ON_GPU1}" in environ


def test_missing_device_node_is_named(driver, tmp_path):
    dev = make_dev(tmp_path / "dev", without=["nvidia4"])
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "BERTH_DEV_ROOT": str(dev)}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, f"{dev}/nvidia4")


def test_gdrcopy_device_and_library_come_with_compute_where_the_node_has_them(driver, tmp_path):
    # A stand-in for a node with GDRCopy's module loaded (no such device
    # here): its character device beside the driver's nodes.
    dev = make_dev(tmp_path / "dev")
    os.mknod(dev / "gdrdrv", stat.S_IFCHR | 0o666, os.makedev(240, 0))
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_DEV_ROOT": str(dev)}
    proc, mounts, _ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert f"{dev}/gdrdrv /dev/gdrdrv {DEVICE_OPTIONS}" in mounts
    assert library_line(driver, "libgdrapi.so.2.4", "libgdrapi.so.2") in mounts
    # without compute, neither
    proc, mounts, _ = run_hook(driver, tmp_path, env | {"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    assert proc.returncode == 0, proc.stderr
    assert "/dev/gdrdrv" not in bound_devices(mounts)
    assert "libgdrapi.so.2" not in bound_names(mounts)
    # without the device (the default /dev of these tests), the library stays out
    proc, mounts, _ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "libgdrapi.so.2" not in bound_names(mounts)


def test_a_wrapper_script_on_path_gives_way_to_the_drivers_own_program(driver, tmp_path):
    # As on a GPU machine whose driver is mounted in at /usr/local/nvidia:
    # PATH's nvidia-smi is a script that execs /usr/local/nvidia/bin/nvidia-smi,
    # a path the container lacks; the program bound must be the driver's ELF
    # file in the bin directory beside its libraries.
    root = tmp_path / "usr-local-nvidia"
    (root / "lib64").mkdir(parents=True)
    (root / "bin").mkdir()
    shutil.copy(driver["libdir"] / f"libnvidia-ml.so.{DRIVER_VERSION}", root / "lib64")
    shutil.copy("/bin/true", root / "bin" / "nvidia-smi")
    cache = tmp_path / "ld.so.cache"
    (tmp_path / "ld.so.conf").write_text(f"{root / 'lib64'}\n")
    subprocess.run(["ldconfig", "-C", cache, "-f", tmp_path / "ld.so.conf"], check=True)
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    (wrappers / "nvidia-smi").write_text(f'#!/bin/sh\nexec {root}/bin/nvidia-smi "$@"\n')
    (wrappers / "nvidia-smi").chmod(0o755)
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_LDCONFIG": f"ldconfig -C {cache} -p"}
    proc, mounts, _ = run_hook(driver, tmp_path, env, extra_path=[wrappers])
    assert proc.returncode == 0, proc.stderr
    assert f"{root}/bin/nvidia-smi /usr/bin/nvidia-smi {LIBRARY_OPTIONS}" in mounts
    # where no ELF file is found, the first on PATH is bound, as before
    proc, mounts, _ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, extra_path=[wrappers])
    assert proc.returncode == 0, proc.stderr
    assert f"{wrappers}/nvidia-smi /usr/bin/nvidia-smi {LIBRARY_OPTIONS}" in mounts


def test_missing_uvm_warns_but_starts(driver, tmp_path):
    dev = make_dev(tmp_path / "dev", without=["nvidia-uvm"])
    proc, mounts, _ = run_hook(driver, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_DEV_ROOT": str(dev)})
    assert proc.returncode == 0
    assert "nvidia-uvm" in proc.stderr and "warning" in proc.stderr
    assert "/dev/nvidia-uvm" not in bound_devices(mounts)


@pytest.mark.parametrize(
    "requirement, disabled, refused",
    [
        ("cuda>=12.4", "", True),
        ("cuda>=12.2", "", False),
        ("cuda>=12.4 brand=tesla,driver>=535,driver<536", "", False),
        ("cuda>=12.4 brand=tesla,driver>=470,driver<471", "", True),
        ("cuda>=12.4", "true", False),
    ],
)
def test_requirements_against_the_driver(driver, tmp_path, requirement, disabled, refused):
    # two-a100's nvidia-smi stand-in reports driver 535.104.05, CUDA 12.2.
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": requirement, "NVIDIA_DISABLE_REQUIRE": disabled}
    proc, mounts, environ = run_hook(driver, tmp_path, env, tree="two-a100")
    if refused:
        assert_refused(proc, mounts, environ, "NVIDIA_REQUIRE_CUDA", "CUDA 12.2")
    else:
        assert proc.returncode == 0, proc.stderr
        assert mounts


def test_unreadable_requirement_is_refused(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_ARCH": "sm~90"}
    proc, mounts, environ = run_hook(driver, tmp_path, env, tree="two-a100")
    assert_refused(proc, mounts, environ, "NVIDIA_REQUIRE_ARCH", "sm~90")


def test_bad_library_list_names_file_and_line(driver, tmp_path):
    conf = tmp_path / "nvidia-libraries.conf"
    conf.write_text("# list\ncompute lib libcuda.so\ncompute library libnvidia-ml.so\n")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_NVIDIA_LIBRARIES": str(conf)}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, f"{conf}:3", "library")


def test_files_of_a_capability_are_bound_where_present(driver, tmp_path):
    icd = tmp_path / "nvidia_icd.json"
    icd.write_text("{}\n")
    conf = tmp_path / "nvidia-libraries.conf"
    conf.write_text(f"graphics file {icd}\ngraphics file {tmp_path}/absent.json\ncompute lib libcuda.so\n")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_NVIDIA_LIBRARIES": str(conf)}
    proc, mounts, _ = run_hook(driver, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert not any("nvidia_icd" in line for line in mounts)
    proc, mounts, _ = run_hook(driver, tmp_path, env | {"NVIDIA_DRIVER_CAPABILITIES": "graphics"})
    assert proc.returncode == 0, proc.stderr
    assert f"{icd} {icd} none bind,nosuid,noexec,x-create=file" in mounts
    assert not any("absent.json" in line for line in mounts)


def test_relative_file_in_the_list_is_refused(driver, tmp_path):
    conf = tmp_path / "nvidia-libraries.conf"
    conf.write_text("graphics file share/nvidia_icd.json\n")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_NVIDIA_LIBRARIES": str(conf)}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, f"{conf}:1", "share/nvidia_icd.json")


def test_unknown_backend_is_refused(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_NVIDIA_BACKEND": "magic"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, "BERTH_NVIDIA_BACKEND", "magic")


def test_nvidia_container_cli_backend(driver, tmp_path):
    # A stand-in for libnvidia-container's CLI that records its arguments.
    bindir = tmp_path / "cli-bin"
    bindir.mkdir()
    record = tmp_path / "cli-args"
    cli = bindir / "nvidia-container-cli"
    cli.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    cli.chmod(0o755)
    env = {
        "NVIDIA_VISIBLE_DEVICES": "1,3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute",
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
        "BERTH_NVIDIA_BACKEND": "nvidia-container-cli",
    }
    proc, mounts, environ = run_hook(driver, tmp_path, env, extra_path=[bindir])
    assert proc.returncode == 0, proc.stderr
    args = record.read_text().splitlines()
    assert args[:3] == ["--user", "configure", "--no-cgroups"]
    assert "--device=1,3" in args and "--compute" in args and "--utility" not in args
    assert "--pid=4242" in args and "--require=cuda>=12.0" in args
    assert args[-1] == str(tmp_path / "rootfs")
    assert mounts == [] and environ == []


def test_nvidia_container_cli_backend_needs_the_cli(driver, tmp_path):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "BERTH_NVIDIA_BACKEND": "nvidia-container-cli"}
    proc, mounts, environ = run_hook(driver, tmp_path, env)
    assert_refused(proc, mounts, environ, "nvidia-container-cli")


def test_a_cdi_spec_on_the_node_is_asked_for_the_chosen_gpus_only(driver, tmp_path):
    """With BERTH_NVIDIA_CDI_GPUS (the runtime's list of the node's
    nvidia.com/gpu devices), the hook binds nothing itself: it names the
    chosen GPUs, by index where the spec has it, else by UUID, in $BERTH_CDI_DEVICES."""
    asked = tmp_path / "cdi-devices"
    asked.write_text("")
    env = {"SLURM_STEP_GPUS": "0,1", "BERTH_CDI_DEVICES": str(asked),
           "BERTH_NVIDIA_CDI_GPUS": f"0 {UUID_GPU1_TWO_A100} all"}
    proc, mounts, environ = run_hook(driver, tmp_path, env, tree="two-a100")
    assert proc.returncode == 0, proc.stderr
    assert mounts == []
    assert environ == ["CUDA_VISIBLE_DEVICES=0,1"]
    assert asked.read_text().splitlines() == ["nvidia.com/gpu=0",
                                              f"nvidia.com/gpu={UUID_GPU1_TWO_A100}"]


def test_a_mig_device_is_asked_for_by_its_uuid(driver, tmp_path):
    asked = tmp_path / "cdi-devices"
    asked.write_text("")
    env = {"CUDA_VISIBLE_DEVICES": MIG_ON_GPU1, "BERTH_CDI_DEVICES": str(asked),
           "BERTH_NVIDIA_CDI_GPUS": f"0 1 {MIG_ON_GPU1}"}
    proc, mounts, _ = run_hook(driver, tmp_path, env, tree="two-a100")
    assert (proc.returncode, mounts) == (0, [])
    assert asked.read_text() == f"nvidia.com/gpu={MIG_ON_GPU1}\n"
