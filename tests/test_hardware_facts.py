"""library/berth_hardware_facts.py against fabricated nodes.

tests/fixtures/gpu/* stand in for real hardware: procfs and sysfs trees in the
NVIDIA driver's and the kernel's formats (a DGX H100 with 8 NVLinked GPUs and
8 mlx5 HCAs; two PCIe A100s with a RoCE bond), and nvidia-smi stand-ins that
print canned `topo -m` output. The module runs as Ansible runs it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "library" / "berth_hardware_facts.py"
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
BIN = Path(sys.executable).parent


def run_module(tmp_path, **args):
    """Run the module the way Ansible's local runner does; return its JSON result."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, MODULE, args_file], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout)


def node(tree):
    return {"proc_root": str(FIXTURES / tree / "proc"), "sys_root": str(FIXTURES / tree / "sys"),
            "nvidia_smi": str(FIXTURES / tree / "bin" / "nvidia-smi")}


def test_dgx_gpus_topology_and_hcas(tmp_path):
    result = run_module(tmp_path, **node("dgx-h100"))
    assert not result.get("failed") and result["changed"] is False
    facts = result["ansible_facts"]
    assert facts["berth_gpu_count"] == 8
    assert facts["berth_nvidia_driver_version"] == "550.54.15"  # open kernel module's wording
    assert [g["index"] for g in facts["berth_gpus"]] == list(range(8))
    assert [g["minor"] for g in facts["berth_gpus"]] == list(range(8))
    assert {g["model"] for g in facts["berth_gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert facts["berth_gpus"][3]["uuid"] == "gpu-31a2b3c4-5d6e-7f80-91a2-b3c4d5e6f703"
    assert facts["berth_gpus"][0]["bus_id"] == "0000:18:00.0"
    topology = facts["berth_gpu_topology"]
    assert sorted(topology) == [f"GPU{i}" for i in range(8)]
    assert topology["GPU0"]["GPU7"] == "NV18" and "GPU0" not in topology["GPU0"]
    assert topology["GPU2"]["mlx5_2"] == "PXB" and topology["GPU2"]["mlx5_6"] == "SYS"
    assert facts["berth_nvlink"] is True
    assert facts["berth_ib_count"] == 8
    first = facts["berth_ib_hcas"][0]
    assert first["name"] == "mlx5_0" and first["uverbs"] == "uverbs0" and first["hca_type"] == "MT4129"
    assert first["ports"] == [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)"}]


def test_index_is_bus_order_and_minor_is_the_drivers(tmp_path):
    facts = run_module(tmp_path, **node("two-a100"))["ansible_facts"]
    assert facts["berth_nvidia_driver_version"] == "535.104.05"  # proprietary module's wording
    assert [(g["index"], g["minor"], g["bus_id"]) for g in facts["berth_gpus"]] == [
        (0, 1, "0000:07:00.0"), (1, 0, "0000:0f:00.0")]
    assert facts["berth_gpu_topology"] == {"GPU0": {"GPU1": "SYS"}, "GPU1": {"GPU0": "SYS"}}
    assert facts["berth_nvlink"] is False
    assert [(h["name"], h["uverbs"], h["ports"][0]["link_layer"]) for h in facts["berth_ib_hcas"]] == [
        ("mlx5_bond_0", "uverbs3", "Ethernet")]


def failing_nvidia_smi(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    smi.chmod(0o755)
    return str(smi)


def test_node_without_gpus_or_hcas(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    # nvidia-smi is not even asked when the driver lists no GPU.
    result = run_module(tmp_path, proc_root=str(tmp_path / "proc"), sys_root=str(tmp_path / "sys"),
                        nvidia_smi=failing_nvidia_smi(tmp_path))
    assert not result.get("failed") and not result.get("warnings")
    assert result["ansible_facts"] == {
        "berth_gpu_count": 0, "berth_gpus": [], "berth_nvidia_driver_version": "",
        "berth_gpu_topology": {}, "berth_nvlink": False,
        "berth_ib_count": 0, "berth_ib_hcas": []}


def test_without_nvidia_smi_gpus_are_still_listed(tmp_path):
    facts = run_module(tmp_path, **node("dgx-h100") | {"nvidia_smi": ""})["ansible_facts"]
    assert facts["berth_gpu_count"] == 8 and facts["berth_gpu_topology"] == {}


def test_broken_nvidia_smi_warns_and_keeps_the_gpus(tmp_path):
    result = run_module(tmp_path, **node("dgx-h100") | {"nvidia_smi": failing_nvidia_smi(tmp_path)})
    assert not result.get("failed")
    # ansible-core 2.19 returns warnings as structured events
    assert "Driver/library version mismatch" in json.dumps(result["warnings"])
    assert result["ansible_facts"]["berth_gpu_count"] == 8
    assert result["ansible_facts"]["berth_gpu_topology"] == {}


@pytest.mark.parametrize("option", ["proc_root", "sys_root", "nvidia_smi"])
def test_bad_path_is_named(tmp_path, option):
    result = run_module(tmp_path, **node("dgx-h100") | {option: str(tmp_path / "missing")})
    assert result["failed"] is True
    assert f"{option}: {tmp_path / 'missing'}" in result["msg"]


def test_unreadable_gpu_entry_is_named(tmp_path):
    information = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:01:00.0" / "information"
    information.parent.mkdir(parents=True)
    information.write_text("Model: \t\t NVIDIA L40S\n")
    result = run_module(tmp_path, proc_root=str(tmp_path / "proc"), sys_root=str(tmp_path), nvidia_smi="")
    assert result["failed"] is True
    assert str(information) in result["msg"] and "Device Minor" in result["msg"]


@pytest.mark.playbook
def test_facts_reach_the_play_in_check_mode(tmp_path):
    play = tmp_path / "play.yml"
    out = tmp_path / "facts.json"
    play.write_text(f"""
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Gather
      berth_hardware_facts:
        proc_root: {FIXTURES}/two-a100/proc
        sys_root: {FIXTURES}/two-a100/sys
        nvidia_smi: {FIXTURES}/two-a100/bin/nvidia-smi
    - name: Save
      ansible.builtin.copy:
        content: "{{{{ {{'count': berth_gpu_count, 'uuids': berth_gpus | map(attribute='uuid') | list}} | to_json }}}}"
        dest: {out}
      check_mode: false
""")
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_DEPRECATION_WARNINGS="false")
    subprocess.run([BIN / "ansible-playbook", "-i", "localhost,", "-c", "local", "--check",
                    "-e", f"ansible_python_interpreter={sys.executable}", play],
                   env=env, check=True, capture_output=True, text=True, timeout=120)
    assert json.loads(out.read_text()) == {
        "count": 2, "uuids": ["gpu-aaaaaaaa-0000-1111-2222-333333333333", "gpu-bbbbbbbb-0000-1111-2222-333333333333"]}


def test_documentation_renders():
    proc = subprocess.run([BIN / "ansible-doc", "-M", REPO / "library", "berth_hardware_facts"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "berth_gpu_topology" in proc.stdout and "nvidia_smi" in proc.stdout
