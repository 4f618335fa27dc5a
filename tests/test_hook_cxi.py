"""hooks/88-cxi.sh against a fabricated Slingshot node.

The hardware is mocked: there is no Slingshot NIC here. Its device nodes
are made with mknod in a temporary /dev (cxi0, cxi1, with the cxi driver's
character device numbers' shape); the node's libfabric and libcxi are small
shared libraries built here with their sonames and file names (libfabric
linking libcxi, libcxi linking a support library, as the real ones do),
listed by a canned `ldconfig -p`; an image root's ld.so cache is written
by `ldconfig -r`, as an image's build does. The tests read the lines the
hook appends, and the last one makes a real `berth start` of a busybox
image with them.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import fake_libraries
from fake_libraries import MULTIARCH, image, shared_library

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "hooks" / "88-cxi.sh"
ON = {"BERTH_HOOK_CXI_ENABLE": "yes"}
LIB_DIR = "/usr/local/berth/cxi/lib"
NEED = "bind,ro,nosuid,nodev,x-create=file"
DEVICE = "bind,nosuid,noexec,x-create=file"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of device nodes needs root")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """The node's libfabric 1.22.0 with libcxi and what libcxi needs, /dev/cxi0 and 1."""
    root = tmp_path_factory.mktemp("slingshot")
    lib = root / "lib64"
    lib.mkdir()
    support = shared_library(lib / "libjson-c.so.5.2.0", "libjson-c.so.5")
    cxi = shared_library(lib / "libcxi.so.1.5.0", "libcxi.so.1", needs=support)
    fabric = shared_library(lib / "libfabric.so.1.22.0", "libfabric.so.1", needs=cxi)
    listing = root / "ldconfig-p.txt"
    listing.write_text("3 libs found in cache `/etc/ld.so.cache'\n"
                       f"\tlibfabric.so.1 (libc6,x86-64) => {fabric}\n"
                       f"\tlibcxi.so.1 (libc6,x86-64) => {cxi}\n"
                       f"\tlibjson-c.so.5 (libc6,x86-64) => {support}\n")
    dev = root / "dev"
    dev.mkdir()
    for minor in (0, 1):
        os.mknod(dev / f"cxi{minor}", stat.S_IFCHR | 0o666, os.makedev(235, minor))
    settings = root / "cxi.env"
    settings.write_text("# the site's cxi provider settings\nFI_CXI_RX_MATCH_MODE=hybrid\n"
                        "FI_MR_CACHE_MONITOR=userfaultfd\n")
    return {"lib": lib, "listing": listing, "dev": dev, "settings": settings}


def run_hook(root, node, env=None):
    return fake_libraries.run_hook(HOOK, root, {
        "BERTH_DEV_ROOT": str(node["dev"]), "BERTH_LDCONFIG": f"cat {node['listing']}",
        "BERTH_CXI_ENVIRONMENT": str(node["settings"]), **(env or {})})


def node_libraries(node):
    lib = node["lib"]
    return [f"{lib}/libfabric.so.1.22.0 {LIB_DIR}/libfabric.so.1 none {NEED}",
            f"{lib}/libcxi.so.1.5.0 {LIB_DIR}/libcxi.so.1 none {NEED}",
            f"{lib}/libjson-c.so.5.2.0 {LIB_DIR}/libjson-c.so.5 none {NEED}"]


def devices(node):
    return [f"{node['dev']}/cxi{n} /dev/cxi{n} none {DEVICE}" for n in (0, 1)]


SETTINGS = ["FI_PROVIDER=cxi", "FI_CXI_RX_MATCH_MODE=hybrid", "FI_MR_CACHE_MONITOR=userfaultfd"]


def test_the_nodes_libfabric_replaces_the_images_with_the_devices(tmp_path, node):
    root = image(tmp_path, ("libfabric.so.1.18.1", "libfabric.so.1"), ("libz.so.1.3", "libz.so.1"))
    process, mounts, environ = run_hook(root, node, ON)
    assert (process.returncode, process.stderr) == (0, "")
    over = (f"{node['lib']}/libfabric.so.1.22.0 /{MULTIARCH}/libfabric.so.1 none "
            "bind,ro,nosuid,nodev")
    assert sorted(mounts) == sorted([*devices(node), over, *node_libraries(node)])
    assert environ == [f"LD_LIBRARY_PATH={LIB_DIR}:/opt/app/lib", *SETTINGS]


def test_an_image_without_libfabric_gets_the_nodes_on_its_path(tmp_path, node):
    root = image(tmp_path, ("libz.so.1.3", "libz.so.1"))
    process, mounts, environ = run_hook(root, node, ON | {"BERTH_CXI_ENVIRONMENT": ""})
    assert (process.returncode, process.stderr) == (0, "")
    assert sorted(mounts) == sorted([*devices(node), *node_libraries(node)])
    assert environ == [f"LD_LIBRARY_PATH={LIB_DIR}:/opt/app/lib", "FI_PROVIDER=cxi"]


@pytest.mark.parametrize("env", [{}, {"BERTH_HOOK_CXI_ENABLE": "no"},
                                 {"BERTH_HOOK_CXI_ENABLE": "0"}], ids=["default", "no", "edf-false"])
def test_off_unless_switched_on(tmp_path, node, env):
    root = image(tmp_path, ("libfabric.so.1.18.1", "libfabric.so.1"))
    process, mounts, environ = run_hook(root, node, env)
    assert (process.returncode, process.stderr, mounts, environ) == (0, "", [], [])


def test_a_node_without_slingshot_is_quietly_left_alone(tmp_path, node):
    root = image(tmp_path, ("libfabric.so.1.18.1", "libfabric.so.1"))
    empty = tmp_path / "dev"
    empty.mkdir()
    (empty / "cxi0").write_text("")  # not a device node
    process, mounts, environ = run_hook(root, node | {"dev": empty}, ON)
    assert (process.returncode, process.stdout, process.stderr, mounts, environ) == \
        (0, "", "", [], [])


@pytest.mark.parametrize("libraries, env, message", [
    ([("libfabric.so.2.0.0", "libfabric.so.2")], {},
     "the image's libfabric is libfabric.so.2, another ABI than the node's libfabric.so.1: "
     "not replaced"),
    ([("libfabric.so.1.23.0", "libfabric.so.1")], {},
     "the image's libfabric 1.23.0 is newer than the node's 1.22.0: not replaced"),
    ([], {"BERTH_CXI_ENVIRONMENT": "/no/such.env"},
     "BERTH_CXI_ENVIRONMENT: /no/such.env: no such file on this node"),
], ids=["other-abi", "newer", "no-settings-file"])
def test_refusals_bind_nothing(tmp_path, node, libraries, env, message):
    root = image(tmp_path, *libraries)
    process, mounts, environ = run_hook(root, node, ON | env)
    assert process.returncode == 1
    assert process.stderr == f"cxi hook: {message}\n"
    assert (mounts, environ) == ([], [])


def test_a_node_missing_libcxi_is_refused(tmp_path, node):
    listing = tmp_path / "ldconfig-p.txt"
    listing.write_text("".join(line + "\n" for line in node["listing"].read_text().splitlines()
                               if "libcxi" not in line))
    process, mounts, _ = run_hook(image(tmp_path), node | {"listing": listing}, ON)
    assert process.returncode == 1 and mounts == []
    assert process.stderr == ("cxi hook: this node has Slingshot devices but no libcxi.so.1 in "
                              "its ld.so cache\n")


def test_a_settings_line_that_is_no_provider_setting_is_refused(tmp_path, node):
    """The site's file sets the provider's FI_* variables, and nothing else
    (LD_PRELOAD there would reach every process of the container)."""
    bad = tmp_path / "cxi.env"
    bad.write_text("FI_CXI_OPTIMIZED_MRS=false\nLD_PRELOAD=/tmp/x.so\n")
    process, mounts, environ = run_hook(image(tmp_path), node,
                                        ON | {"BERTH_CXI_ENVIRONMENT": str(bad)})
    assert process.returncode == 1 and (mounts, environ) == ([], [])
    assert process.stderr == (f"cxi hook: {bad}: expected an FI_* KEY=VALUE line, got "
                              "'LD_PRELOAD=/tmp/x.so'\n")


def test_an_images_link_is_read_not_followed(tmp_path, node):
    """The image's libfabric.so.1 is a link leading out of its root: its name
    gives the version, and the node's library is bound at the cache's path."""
    root = image(tmp_path, ("libfabric.so.1.18.1", "libfabric.so.1"))
    link = root / MULTIARCH / "libfabric.so.1"
    link.unlink()
    link.symlink_to("/etc/../../libfabric.so.1.99.0")
    process, mounts, _ = run_hook(root, node, ON)
    assert process.returncode == 1 and mounts == []
    assert process.stderr == ("cxi hook: the image's libfabric 1.99.0 is newer than the node's "
                              "1.22.0: not replaced\n")


def test_a_real_start_sees_the_devices_the_nodes_libraries_and_the_settings(tmp_path, node):
    """Through `berth start`: the mocked NIC's node is a character device in
    the container, the image's libfabric path holds the node's library, and
    the provider's settings are in the command's environment."""
    sysconf = tmp_path / "sys"
    (sysconf / "hooks.d").mkdir(parents=True)
    for name in ("88-cxi.sh", "common.bash"):
        shutil.copy(REPO / "hooks" / name, sysconf / "hooks.d" / name)
    root = image(tmp_path / "data", ("libfabric.so.1.18.1", "libfabric.so.1"))
    root = root.rename(tmp_path / "data" / "app")
    for directory in ("bin", "proc", "dev", "sys", "tmp"):
        (root / directory).mkdir(exist_ok=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ("sh", "cmp", "stat", "cat"):
        (root / "bin" / applet).symlink_to("busybox")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO / "runtime"), "ENROOT_SYSCONF_PATH": str(sysconf),
           "ENROOT_DATA_PATH": str(tmp_path / "data"), "ENROOT_RUNTIME_PATH": str(tmp_path / "run"),
           "ENROOT_CONFIG_PATH": str(tmp_path / "cfg"), "ENROOT_CACHE_PATH": str(tmp_path / "cache"),
           "BERTH_DEV_ROOT": str(node["dev"]), "BERTH_LDCONFIG": f"cat {node['listing']}",
           "BERTH_CXI_ENVIRONMENT": str(node["settings"]), **ON}
    script = (f"stat -c '%F %t' /dev/cxi0 /dev/cxi1; "
              f"cmp /{MULTIARCH}/libfabric.so.1 {LIB_DIR}/libfabric.so.1 && echo same; "
              'echo "$FI_PROVIDER $FI_CXI_RX_MATCH_MODE $LD_LIBRARY_PATH"')
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from berth.cli import main; sys.exit(main())",
         "start", "app", "sh", "-c", script],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "character special file eb", "character special file eb", "same",
        f"cxi hybrid {LIB_DIR}"]
    # the node's library, not the image's: the bound file is the node's
    assert (node["lib"] / "libfabric.so.1.22.0").read_bytes() != \
        (root / MULTIARCH / "libfabric.so.1.18.1").read_bytes()
