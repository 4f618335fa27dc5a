"""plugins/filter/berth_gres.py and roles/slurm/templates/gres.conf.j2.

GPU lists are shaped like berth_hardware_facts' berth_gpus; the end-to-end
test gathers them with that module from the fabricated nodes in
tests/fixtures/gpu (stand-ins for a DGX H100 and a two-A100 PCIe node) and
renders the template with Ansible's own template module.
"""

import configparser
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
BIN = Path(sys.executable).parent

_spec = importlib.util.spec_from_file_location("berth_gres", REPO / "plugins" / "filter" / "berth_gres.py")
gres = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gres)


def gpu_list(model, minors):
    return [{"index": i, "minor": m, "model": model, "uuid": f"gpu-{i}", "bus_id": f"0000:{i:02x}:00.0"}
            for i, m in enumerate(minors)]


NO_GPUS = []
ONE_GPU = gpu_list("NVIDIA L40S", [0])
DGX_H100 = gpu_list("NVIDIA H100 80GB HBM3", range(8))
DGX_A100 = gpu_list("NVIDIA A100-SXM4-80GB", range(8))


@pytest.mark.parametrize("model, expected", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA GeForce RTX 4090", "rtx_4090"),
    ("NVIDIA RTX A6000", "rtx_a6000"),
    ("Quadro RTX 8000", "rtx_8000"),
])
def test_gpu_type(model, expected):
    assert gres.berth_gpu_type(model) == expected


@pytest.mark.parametrize("model", ["NVIDIA", "", 42])
def test_gpu_type_needs_a_chip_name(model):
    with pytest.raises(AnsibleFilterError, match="berth_gpu_type"):
        gres.berth_gpu_type(model)


@pytest.mark.parametrize("gpus, expected", [
    (NO_GPUS, ""),
    (ONE_GPU, "gpu:l40s:1"),
    (DGX_H100, "gpu:h100:8"),
    (DGX_A100, "gpu:a100:8"),
    (gpu_list("NVIDIA A100-SXM4-40GB", [0, 1]) + [dict(ONE_GPU[0], index=2, minor=2)], "gpu:a100:2,gpu:l40s:1"),
])
def test_node_line_gres(gpus, expected):
    assert gres.berth_gres(gpus) == expected


@pytest.mark.parametrize("gpus, expected", [
    (NO_GPUS, []),
    (ONE_GPU, ["NodeName=gpu01 Name=gpu Type=l40s File=/dev/nvidia0"]),
    (DGX_H100, ["NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia[0-7]"]),
    (gpu_list("NVIDIA H100 80GB HBM3", [0, 1, 2, 5, 7]),
     ["NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia[0-2,5,7]"]),
    # minors falling against the index order: one line per GPU, index order kept
    (gpu_list("NVIDIA A100-SXM4-40GB", [1, 0]),
     ["NodeName=gpu01 Name=gpu Type=a100 File=/dev/nvidia1",
      "NodeName=gpu01 Name=gpu Type=a100 File=/dev/nvidia0"]),
])
def test_gres_conf_lines(gpus, expected):
    assert gres.berth_gres_conf(gpus, "gpu01") == expected


def test_gres_conf_follows_index_not_list_order():
    assert gres.berth_gres_conf(list(reversed(DGX_H100)), "dgx01") == [
        "NodeName=dgx01 Name=gpu Type=h100 File=/dev/nvidia[0-7]"]


@pytest.mark.parametrize("gpus, message", [
    ("gpu:h100:8", "expected the berth_gpus list"),
    ([{"index": 0, "model": "NVIDIA H100"}], "GPU entry 0 has no 'minor'"),
    ([{"index": 0, "minor": "0", "model": "NVIDIA H100"}], "GPU 0 has a bad minor number '0'"),
    (["nvidia0"], "GPU entry 0 is not a mapping"),
])
def test_bad_gpu_list_is_named(gpus, message):
    with pytest.raises(AnsibleFilterError, match=message):
        gres.berth_gres_conf(gpus, "gpu01")


@pytest.mark.parametrize("name", ["", "dgx01 Name=x", None])
def test_bad_node_name_is_refused(name):
    with pytest.raises(AnsibleFilterError, match="bad node name"):
        gres.berth_gres_conf(ONE_GPU, name)


INVENTORY = """
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {python}
  children:
    slurm_compute:
      hosts:
        dgx01: {{node_root: "{fixtures}/dgx-h100", ansible_hostname: dgx01}}
        pcie01: {{node_root: "{fixtures}/two-a100", ansible_hostname: pcie01}}
        cpu01: {{node_root: "{empty}", ansible_hostname: cpu01}}
        gpu01:
          ansible_hostname: gpu01
          berth_gpus: [{{index: 0, minor: 0, model: NVIDIA L40S, uuid: gpu-0, bus_id: "0000:01:00.0"}}]
"""

PLAY = """
- hosts: slurm_compute
  gather_facts: false
  tasks:
    - name: Gather GPUs from the fabricated node
      berth_hardware_facts:
        proc_root: "{{ node_root }}/proc"
        sys_root: "{{ node_root }}/sys"
        nvidia_smi: ""
      when: node_root is defined

- hosts: localhost
  gather_facts: false
  tasks:
    - name: Render gres.conf
      ansible.builtin.template:
        src: "{{ template }}"
        dest: "{{ output }}"
        mode: "0644"
"""


@pytest.mark.playbook
def test_template_renders_the_cluster(tmp_path):
    empty = tmp_path / "cpu-node"
    (empty / "proc").mkdir(parents=True)
    (empty / "sys").mkdir()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable, fixtures=FIXTURES, empty=empty))
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    output = tmp_path / "gres.conf"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_DEPRECATION_WARNINGS="false")
    subprocess.run(
        [BIN / "ansible-playbook", "-i", inventory, play,
         "-e", f"template={REPO}/roles/slurm/templates/gres.conf.j2", "-e", f"output={output}"],
        env=env, check=True, capture_output=True, text=True, timeout=180, cwd=REPO,
    )
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "ansible.cfg")
    lines = output.read_text().splitlines()
    # the site's ansible_managed string, or Ansible's default
    assert lines[0] == "# " + config["defaults"].get("ansible_managed", "Ansible managed")
    assert [line for line in lines if not line.startswith("#")] == [
        "NodeName=dgx01 Name=gpu Type=h100 File=/dev/nvidia[0-7]",
        "NodeName=pcie01 Name=gpu Type=a100 File=/dev/nvidia1",
        "NodeName=pcie01 Name=gpu Type=a100 File=/dev/nvidia0",
        "NodeName=gpu01 Name=gpu Type=l40s File=/dev/nvidia0",
    ]
