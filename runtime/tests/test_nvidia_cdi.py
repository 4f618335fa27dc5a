"""A job's GPUs through NVIDIA's CDI spec, in real starts with the real
hooks/90-nvidia.sh.

The GPUs are mocked: no GPU is here. The node is the 8-GPU procfs tree of
tests/fixtures/gpu/dgx-h100 (BERTH_PROC_ROOT), its device nodes character
devices made with mknod in the test's own root-owned directory (the numbers
of /dev/null), the driver library a text file, and the spec has the shape
`nvidia-ctk cdi generate` writes (kind nvidia.com/gpu, devices by index,
GPU-<uuid> and `all`, common edits with the control nodes, the library
mounts and nvidia-ctk hooks), pointing at those stand-ins. Its nvidia-ctk
is a stand-in too, doing what the two hooks named do, in the root that the
OCI state's bundle names; its ldcache update runs ldconfig as NVIDIA's
does, from mount and pid namespaces of its own.
"""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned specs and mknod")

REPO = Path(__file__).resolve().parents[2]
GPUS = REPO / "tests" / "fixtures" / "gpu" / "dgx-h100" / "proc"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBCUDA = "libcuda.so.550.54.15"
# what the stand-in nvidia-ctk does of `hook create-symlinks` and `hook update-ldcache`
NVIDIA_CTK = """#!/usr/bin/python3
import json, os, subprocess, sys
state = json.load(sys.stdin)
if sys.argv[1:3] == ["hook", "log-state"]:  # not NVIDIA's: the test's poststart hook
    with open(sys.argv[3], "w") as f:
        f.write(state["status"] + "\\n")
    sys.exit(0)
with open(os.path.join(state["bundle"], "config.json")) as f:
    root = json.load(f)["root"]["path"]
args = sys.argv[1:]
if args[:2] == ["hook", "create-symlinks"]:
    target, link = args[3].split("::")
    os.symlink(target, root + link)
elif args[:2] == ["hook", "update-ldcache"]:
    os.makedirs(root + "/etc/ld.so.conf.d", exist_ok=True)
    with open(root + "/etc/ld.so.conf.d/00-nvcr-test.conf", "w") as f:
        f.write(args[3] + "\\n")
    # as NVIDIA's does it: mount and pid namespaces of the hook's own, the
    # node's (static) ldconfig bound onto a tmpfs in the root, run there
    subprocess.run(["unshare", "--mount", "--pid", "--fork", "sh", "-ec", '''
        scratch=$1/run/nvidia-ctk-hook
        mkdir -p "$scratch"
        mount -t tmpfs -o size=4m tmpfs "$scratch"
        touch "$scratch/ldconfig"
        mount --bind -o ro /sbin/ldconfig "$scratch/ldconfig"
        chroot "$1" /run/nvidia-ctk-hook/ldconfig -f /etc/ld.so.conf.d/00-nvcr-test.conf
        ''', "sh", root], check=True)
else:
    sys.exit("nvidia-ctk stand-in: unknown hook " + " ".join(args))
"""


def fixture_gpus():
    """[(index, uuid, minor)] of the procfs tree, in its index (bus) order."""
    found = []
    for index, info in enumerate(sorted(GPUS.glob("driver/nvidia/gpus/*/information"))):
        fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        found.append((index, fields["GPU UUID"].strip(), int(fields["Device Minor"])))
    return found


def nvidia_spec(top, names=("index", "uuid")):
    """The spec nvidia-ctk would write for the fixture's GPUs, by `names`."""
    def nodes(*minors):
        return {"deviceNodes": [{"path": f"/dev/nvidia{m}", "hostPath": f"{top}/dev/nvidia{m}"}
                                for m in minors]}
    devices = []
    for index, uuid, minor in fixture_gpus():
        devices += [{"name": name, "containerEdits": nodes(minor)}
                    for name in (str(index) if "index" in names else None,
                                 uuid if "uuid" in names else None) if name]
    devices.append({"name": "all", "containerEdits": nodes(*(m for _, _, m in fixture_gpus()))})
    ctk = f"{top}/nvidia-ctk"
    return {
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": f"/dev/{n}", "hostPath": f"{top}/dev/{n}"}
                            for n in ("nvidiactl", "nvidia-uvm")],
            "hooks": [
                {"hookName": "createContainer", "path": ctk, "args": [
                    "nvidia-ctk", "hook", "create-symlinks", "--link",
                    f"{LIBCUDA}::{LIBDIR}/libcuda.so.1"]},
                {"hookName": "createContainer", "path": ctk,
                 "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", LIBDIR]}],
            "mounts": [{"hostPath": f"{top}/lib/{LIBCUDA}", "containerPath": f"{LIBDIR}/{LIBCUDA}",
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
        },
    }


@pytest.fixture
def gpu_node(berth):
    """The mocked GPU node, root's (0755), the nvidia hook in hooks.d."""
    top = Path(tempfile.mkdtemp(prefix="hcdi-"))
    top.chmod(0o755)
    (top / "dev").mkdir()
    for _, _, minor in fixture_gpus():
        os.mknod(top / f"dev/nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    for name in ("nvidiactl", "nvidia-uvm"):
        os.mknod(top / f"dev/{name}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (top / "lib").mkdir()
    (top / "lib" / LIBCUDA).write_text("the driver's libcuda\n")
    (top / "nvidia-ctk").write_text(NVIDIA_CTK)
    (top / "nvidia-ctk").chmod(0o755)
    (top / "cdi").mkdir()
    (top / "cdi" / "nvidia.yaml").write_text(yaml.safe_dump(nvidia_spec(top)))
    shutil.copytree(GPUS, top / "proc")
    hooks_d = berth.base / "sys/hooks.d"
    hooks_d.mkdir(parents=True)
    for name in ("90-nvidia.sh", "common.bash", "nvidia-libraries.conf"):
        shutil.copy(REPO / "hooks" / name, hooks_d / name)
    berth.chown(hooks_d)
    berth.env.update({
        "BERTH_CDI_SPEC_DIRS": str(top / "cdi"), "BERTH_PROC_ROOT": str(top / "proc"),
        "BERTH_DEV_ROOT": str(top / "dev"),
        # a /dev of the container's own (a tmpfs): the node's has no /dev/nvidia* to bind over
        "ENROOT_RESTRICT_DEV": "yes"})
    yield top
    shutil.rmtree(top)


SHOW = (f"ls /dev | grep nvidia | tr '\\n' ' '; echo; "
        f"echo \"$NVIDIA_VISIBLE_DEVICES;$CUDA_VISIBLE_DEVICES\"; "
        f"cat {LIBDIR}/libcuda.so.1 2>&1; readlink {LIBDIR}/libcuda.so.1; "
        f"cat /etc/ld.so.conf.d/00-nvcr-test.conf 2>&1; "
        f"test -s /etc/ld.so.cache && echo ld.so.cache; "
        f"grep -c nvidia-ctk-hook /proc/self/mountinfo; true")


def minors(*indices):
    return [f"nvidia{fixture_gpus()[i][2]}" for i in indices]


def test_slurms_gpus_come_from_the_spec_and_no_others(berth, app, gpu_node):
    out = berth.ok("start", "app", "sh", "-c", SHOW, env={"SLURM_STEP_GPUS": "1,2"})
    lines = out.splitlines()
    assert lines[0].split() == sorted([*minors(1, 2), "nvidia-uvm", "nvidiactl"])
    # the ldcache hook's ldconfig ran in the root, its own mounts left behind with it
    assert lines[1:] == ["void;0,1", "the driver's libcuda", LIBCUDA, LIBDIR, "ld.so.cache", "0"]
    assert berth.leftovers() == []


def test_the_specs_poststart_hook_runs_once_the_command_does(berth, app, gpu_node):
    spec = nvidia_spec(gpu_node)
    log = berth.base / "host" / "poststart"
    log.parent.mkdir(exist_ok=True)
    berth.chown(log.parent)
    spec["containerEdits"]["hooks"].append({
        "hookName": "poststart", "path": f"{gpu_node}/nvidia-ctk",
        "args": ["nvidia-ctk", "hook", "log-state", str(log)]})
    (gpu_node / "cdi" / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    assert berth.ok("start", "app", "sleep", "1", env={"SLURM_STEP_GPUS": "0"}) == ""
    assert log.read_text() == "running\n"


def test_a_spec_naming_gpus_by_uuid_is_asked_by_uuid(berth, app, gpu_node):
    (gpu_node / "cdi" / "nvidia.yaml").write_text(
        yaml.safe_dump(nvidia_spec(gpu_node, names=("uuid",))))
    _, uuid, _ = fixture_gpus()[2]
    out = berth.ok("start", "-e", f"NVIDIA_VISIBLE_DEVICES={uuid}",
                   "app", "sh", "-c", SHOW)
    assert out.splitlines()[0].split() == sorted([*minors(2), "nvidia-uvm", "nvidiactl"])


def test_a_bound_gpu_the_spec_lacks_starts_nothing(berth, app, gpu_node):
    spec = nvidia_spec(gpu_node, names=("index",))
    spec["devices"] = [d for d in spec["devices"] if d["name"] != "3"]
    (gpu_node / "cdi" / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    berth.fails("start", "app", "true", env={"SLURM_STEP_GPUS": "2,3"},
                needle="nvidia hook: GPU 3 is not a device of the node's CDI spec")


@pytest.mark.parametrize("how", ["switched-off", "no-spec"])
def test_without_the_spec_the_hook_binds_the_gpus_itself(berth, app, gpu_node, how):
    if how == "switched-off":
        berth.env["BERTH_NVIDIA_CDI"] = "no"
    else:
        (gpu_node / "cdi" / "nvidia.yaml").unlink()
    out = berth.ok("start", "app", "sh", "-c", SHOW, env={"SLURM_STEP_GPUS": "1"})
    lines = out.splitlines()
    assert minors(1)[0] in lines[0].split() and minors(0)[0] not in lines[0].split()
    assert lines[1] == ";0"  # the spec's NVIDIA_VISIBLE_DEVICES=void is not applied
    assert "No such file" in lines[2]  # nor its mounts, nor its hooks
    assert "No such file" in lines[-2] and lines[-1] == "0"
