"""hooks/85-aws_ofi_nccl.sh against a fabricated node: this machine has no
RDMA fabric and no NCCL plugin, so the fabric is a sysfs entry or a /dev/cxi0
made in a temporary tree and the plugins are placeholder files of a site's
plugin directory. The tests read the fstab and environment lines the hook
appends, as the runtime would apply them."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "hooks" / "85-aws_ofi_nccl.sh"
ON = {"BERTH_HOOK_AWS_OFI_NCCL_ENABLE": "yes"}


@pytest.fixture
def node(tmp_path):
    """A node with an InfiniBand HCA and the site's plugins for CUDA 11 and 12."""
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    plugins = tmp_path / "nccl-plugins"
    for variant in ("cuda11", "cuda12"):
        (plugins / variant).mkdir(parents=True)
        (plugins / variant / "libnccl-net-ofi.so").write_text("placeholder\n")
        (plugins / variant / "libfabric.so.1").write_text("placeholder\n")
    (plugins / "cuda12" / "environment").write_text(
        "# the provider's settings\nFI_PROVIDER=verbs\n\nNCCL_NET_GDR_LEVEL=PHB\n")
    return tmp_path


def run_hook(node, env=None, image_env=("CUDA_VERSION=12.4.1",)):
    """The hook as the runtime runs it: (process, fstab lines, environment
    lines it appended). `image_env`: the container's variables."""
    mounts, environ = node / "mounts", node / "environ"
    mounts.write_text("")
    environ.write_text("".join(f"{line}\n" for line in image_env))
    before = environ.read_text()
    process = subprocess.run(
        ["bash", HOOK], capture_output=True, text=True, check=False, timeout=30,
        env={"PATH": os.environ["PATH"], "ENROOT_MOUNTS": str(mounts), "ENROOT_ENVIRON": str(environ),
             "ENROOT_ROOTFS": str(node / "root"), "BERTH_SYS_ROOT": str(node / "sys"),
             "BERTH_DEV_ROOT": str(node / "dev"),
             "BERTH_NCCL_PLUGIN_DIR": str(node / "nccl-plugins"), **(env or {})})
    return process, mounts.read_text().splitlines(), environ.read_text()[len(before):].splitlines()


def test_the_plugin_for_the_images_cuda_major_version(node):
    process, mounts, environ = run_hook(node, ON, image_env=(
        "CUDA_VERSION=12.4.1", "LD_LIBRARY_PATH=/usr/local/cuda/lib64"))
    assert process.returncode == 0 and process.stderr == ""
    assert mounts == [f"{node}/nccl-plugins/cuda12 /usr/local/berth/nccl-plugin none "
                      "bind,ro,nosuid,nodev,x-create=dir"]
    assert environ == ["LD_LIBRARY_PATH=/usr/local/berth/nccl-plugin:/usr/local/cuda/lib64",
                       "NCCL_NET_PLUGIN=ofi", "FI_PROVIDER=verbs", "NCCL_NET_GDR_LEVEL=PHB"]
    # an older image: its major version's plugin, which has no environment file
    process, mounts, environ = run_hook(node, ON, image_env=("CUDA_VERSION=11.8",))
    assert mounts[0].startswith(f"{node}/nccl-plugins/cuda11 ")
    assert environ == ["LD_LIBRARY_PATH=/usr/local/berth/nccl-plugin", "NCCL_NET_PLUGIN=ofi"]


def test_the_annotations_variant_wins_and_slingshot_counts_as_a_fabric(node):
    (node / "sys/class/infiniband/mlx5_0").rmdir()
    (node / "dev/cxi0").write_text("")  # Slingshot's device, standing in
    process, mounts, _ = run_hook(node, {**ON, "BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda11"})
    assert process.returncode == 0, process.stderr
    assert mounts[0].startswith(f"{node}/nccl-plugins/cuda11 ")


@pytest.mark.parametrize("case", ["off", "no fabric", "no CUDA in the image"])
def test_skipped_quietly(node, case):
    env, image_env = ON, ("CUDA_VERSION=12.4.1",)
    if case == "off":
        env = {"BERTH_HOOK_AWS_OFI_NCCL_ENABLE": "no"}
    elif case == "no fabric":
        (node / "sys/class/infiniband/mlx5_0").rmdir()
    else:
        image_env = ("PATH=/usr/bin",)
    process, mounts, environ = run_hook(node, env, image_env)
    assert (process.returncode, process.stdout, process.stderr, mounts, environ) == (0, "", "", [], [])


@pytest.mark.parametrize("env, image_env, message", [
    ({"BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda13"}, (),
     "no plugin for variant cuda13 on this node (BERTH_NCCL_PLUGIN_DIR {node}/nccl-plugins has: cuda11 cuda12 )"),
    ({"BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "../../etc"}, (),
     "BERTH_HOOK_AWS_OFI_NCCL_VARIANT: '../../etc' is not a variant name (cuda12, rocm6, ...)"),
    ({"BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda12\nX=1"}, (),
     "BERTH_HOOK_AWS_OFI_NCCL_VARIANT: 'cuda12?X=1' is not a variant name (cuda12, rocm6, ...)"),
    ({}, ("CUDA_VERSION=twelve",),
     "CUDA_VERSION: 'twelve' is not a CUDA version (name the variant: com.hooks.aws_ofi_nccl.variant)"),
    ({}, ("CUDA_VERSION=99999999999999999999.0",),
     "CUDA_VERSION: '99999999999999999999.0' is not a CUDA version"),
    ({"BERTH_NCCL_PLUGIN_DIR": ""}, ("CUDA_VERSION=12.4",),
     "this site has no NCCL plugins (BERTH_NCCL_PLUGIN_DIR is not set in enroot.conf)"),
    ({"BERTH_HOOK_AWS_OFI_NCCL_ENABLE": "sometimes"}, (),
     "BERTH_HOOK_AWS_OFI_NCCL_ENABLE: expected yes or no, got 'sometimes'"),
])
def test_a_bad_setting_is_one_line_and_adds_nothing(node, env, image_env, message):
    process, mounts, environ = run_hook(node, {**ON, **env}, image_env)
    assert process.returncode == 1 and (mounts, environ) == ([], [])
    assert process.stderr.startswith(f"aws_ofi_nccl hook: {message.format(node=node)}")
    assert process.stderr.count("\n") == 1


def test_a_broken_plugin_directory_is_one_line_and_adds_nothing(node):
    (node / "nccl-plugins/cuda12/libnccl-net-sharp.so").write_text("placeholder\n")
    process, mounts, environ = run_hook(node, ON)
    assert process.stderr == (f"aws_ofi_nccl hook: {node}/nccl-plugins/cuda12: expected one "
                              "libnccl-net-NAME.so, found 2\n")
    assert (process.returncode, mounts, environ) == (1, [], [])
    (node / "nccl-plugins/cuda12/libnccl-net-sharp.so").unlink()
    (node / "nccl-plugins/cuda12/environment").write_text("FI_PROVIDER=verbs\nnot a setting\n")
    process, mounts, environ = run_hook(node, ON)
    assert process.stderr == (f"aws_ofi_nccl hook: {node}/nccl-plugins/cuda12/environment: "
                              "expected KEY=VALUE, got 'not a setting'\n")
    assert (process.returncode, mounts, environ) == (1, [], [])
