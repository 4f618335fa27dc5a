"""roles/slurm/templates/slurm.conf.j2 rendered by Ansible for a DGX-style
cluster: node lines from facts or inventory, and GPUs from berth_hardware_facts
run against fabricated driver trees (tests/fixtures/gpu, standing in for real
GPUs) for nodes with 8, 2, 1 and no GPUs."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FIXTURES = REPO / "tests" / "fixtures" / "gpu"

FACTS = ("ansible_processor_vcpus: 256, ansible_processor_count: 2, ansible_processor_cores: 64, "
         "ansible_processor_threads_per_core: 2, ansible_memtotal_mb: 2063937")

INVENTORY = f"""
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {sys.executable}
  children:
    slurm_controller:
      hosts:
        head01: {{ansible_hostname: head01}}
    slurm_compute:
      hosts:
        dgx01: {{node_root: "{FIXTURES}/dgx-h100", ansible_hostname: dgx01, {FACTS}}}
        dgx02: {{node_root: "{FIXTURES}/dgx-h100", ansible_hostname: dgx02, {FACTS}, slurm_real_memory: 2000000}}
        pcie01: {{node_root: "{FIXTURES}/two-a100", ansible_hostname: pcie01, {FACTS}}}
        gpu01: {{ansible_hostname: gpu01, {FACTS},
                 berth_gpus: [{{index: 0, minor: 0, model: NVIDIA L40S, uuid: gpu-0, bus_id: "0000:01:00.0"}}]}}
        cpu01: {{node_root: "{{cpu_root}}", ansible_hostname: cpu01, {FACTS}}}
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

- hosts: head01
  gather_facts: false
  vars_files:
    - "{{ repo }}/roles/slurm/defaults/main.yml"
    - "{{ repo }}/roles/slurm/vars/Debian.yml"
    - "{{ repo }}/roles/slurm/vars/main.yml"
  vars:
    ansible_architecture: x86_64
  tasks:
    - name: Render slurm.conf
      ansible.builtin.template:
        src: "{{ repo }}/roles/slurm/templates/slurm.conf.j2"
        dest: "{{ output }}"
        mode: "0644"
"""


def render(tmp_path):
    cpu_root = tmp_path / "cpu-node"
    (cpu_root / "proc").mkdir(parents=True)
    (cpu_root / "sys").mkdir()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.replace("{cpu_root}", str(cpu_root)))
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    output = tmp_path / "slurm.conf"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_DEPRECATION_WARNINGS="false")
    result = subprocess.run(
        [BIN / "ansible-playbook", "-i", inventory, play, "-e", f"repo={REPO}", "-e", f"output={output}"],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return output.read_text()


def node_line(conf, name):
    match = re.search(rf"^NodeName={name} (.*)$", conf, re.M)
    assert match, conf
    return match.group(1)


def test_dgx_cluster_node_lines(tmp_path):
    conf = render(tmp_path)
    assert "SlurmctldHost=head01" in conf
    assert "GresTypes=gpu" in conf
    assert "MpiDefault=pmix" in conf
    assert "include" not in conf
    dgx = node_line(conf, "dgx01")
    assert dgx == ("CPUs=256 Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 "
                   "RealMemory=2062913 Gres=gpu:h100:8 State=UNKNOWN")
    assert "RealMemory=2000000 Gres=gpu:h100:8" in node_line(conf, "dgx02")
    assert "Gres=gpu:a100:2" in node_line(conf, "pcie01")
    assert "Gres=gpu:l40s:1" in node_line(conf, "gpu01")
    assert "Gres" not in node_line(conf, "cpu01")
    assert re.search(r"^PartitionName=batch Nodes=dgx01,dgx02,pcie01,gpu01,cpu01 Default=YES", conf, re.M)
