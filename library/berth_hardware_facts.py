#!/usr/bin/python
# Copyright: Berth contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about a node's GPUs and InfiniBand HCAs, for gres.conf and the hooks."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: berth_hardware_facts
short_description: Gather a node's NVIDIA GPUs and InfiniBand HCAs as facts
description:
  - Reads the GPUs from the NVIDIA driver's C(/proc/driver/nvidia/gpus) tree
    (model, UUID, minor number, PCI bus id), in nvidia-smi's index order, which
    is PCI bus order. This is the same source and order the Berth NVIDIA hook
    uses, so an index in the facts, in gres.conf and in
    C(NVIDIA_VISIBLE_DEVICES) names the same GPU. It needs no nvidia-smi and
    does not wake the GPUs.
  - Adds the GPU interconnect matrix (NVLink, PCIe) from C(nvidia-smi topo -m)
    when nvidia-smi is there and GPUs are present.
  - Reads the InfiniBand/RoCE HCAs from C(/sys/class/infiniband).
  - A node without the NVIDIA driver or without HCAs reports a count of 0.
  - Reads only; never changes the node.
options:
  proc_root:
    description: Where procfs is mounted.
    type: path
    default: /proc
  sys_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  nvidia_smi:
    description:
      - The nvidia-smi program used for the topology matrix. Left unset, it
        is looked up on the PATH and skipped when absent; an empty string
        skips it.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
notes:
  - When nvidia-smi fails (for example after a driver upgrade without a
    reboot) the module warns and leaves the topology empty; the GPU list,
    which comes from the driver itself, is still returned.
author:
  - Berth contributors
"""

EXAMPLES = r"""
- name: Gather GPUs and HCAs
  berth_hardware_facts:

- name: Show what a compute node has
  ansible.builtin.debug:
    msg: >-
      {{ berth_gpu_count }} GPUs ({{ berth_gpus | map(attribute='model') | unique | join(', ') }}),
      {{ berth_ib_count }} HCAs
"""

RETURN = r"""
ansible_facts:
  description: The node's GPUs and HCAs.
  returned: always
  type: dict
  contains:
    berth_gpu_count:
      description: Number of NVIDIA GPUs.
      type: int
      sample: 8
    berth_gpus:
      description: One entry per GPU, in index order.
      type: list
      elements: dict
      sample:
        - index: 0
          model: NVIDIA H100 80GB HBM3
          uuid: GPU-01a2b3c4-5d6e-7f80-91a2-b3c4d5e6f700
          minor: 0
          bus_id: "0000:18:00.0"
    berth_nvidia_driver_version:
      description: The loaded NVIDIA kernel driver's version; empty without the driver.
      type: str
      sample: 550.54.15
    berth_gpu_topology:
      description:
        - The matrix of C(nvidia-smi topo -m) for each GPU, C(GPUn) to peer
          (C(GPUm) or the HCA's name) to link (C(NV18) is 18 bonded NVLinks;
          C(PIX), C(PXB), C(PHB), C(NODE), C(SYS) are PCIe paths). Empty
          without nvidia-smi.
      type: dict
      sample: {"GPU0": {"GPU1": "NV18", "mlx5_0": "PXB"}}
    berth_nvlink:
      description: Whether any two GPUs are joined by NVLink.
      type: bool
      sample: true
    berth_ib_count:
      description: Number of InfiniBand/RoCE HCAs.
      type: int
      sample: 8
    berth_ib_hcas:
      description: One entry per HCA, in name order (mlx5_2 before mlx5_10).
      type: list
      elements: dict
      sample:
        - name: mlx5_0
          uverbs: uverbs0
          hca_type: MT4129
          board_id: MT_0000000838
          fw_ver: 28.39.1002
          node_guid: a088:c203:0000:1f2e
          ports:
            - port: 1
              state: ACTIVE
              link_layer: InfiniBand
              rate: 400 Gb/sec (4X NDR)
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule


def natural_key(name):
    """mlx5_2 before mlx5_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def read_gpu(information):
    """One GPU from its procfs `information` file ("Key: value" lines)."""
    fields = {}
    for line in read_text(information).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    if not fields.get("Device Minor", "").isdigit():
        raise ValueError(f"{information}: no Device Minor line")
    return {
        "model": fields.get("Model", ""),
        "uuid": fields.get("GPU UUID", "").lower(),
        "minor": int(fields["Device Minor"]),
        "bus_id": fields.get("Bus Location",
                             os.path.basename(os.path.dirname(information))).lower(),
    }


def gpus(proc_root):
    """The GPUs in index order: the driver's directories are named by bus id."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    found = [read_gpu(os.path.join(base, name, "information")) for name in names]
    return [dict(gpu, index=index) for index, gpu in enumerate(found)]


def driver_version(proc_root):
    """From the driver's version line ('... Kernel Module  550.54.15  ...')."""
    text = read_text(os.path.join(proc_root, "driver", "nvidia", "version"))
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else ""


def parse_topology(text):
    """`nvidia-smi topo -m` -> {GPUn: {peer: link}}; NICk peers get their HCA names."""
    nic_names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    lines = text.splitlines()
    if not lines:
        return {}
    header = [cell.strip() for cell in lines[0].split("\t")]
    peers = []
    for cell in header[1:]:
        if not re.fullmatch(r"(GPU|NIC)\d+|mlx\d+_\d+", cell):
            break
        peers.append(nic_names.get(cell, cell))
    matrix = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = [cell.strip() for cell in line.split("\t")]
        if re.fullmatch(r"GPU\d+", cells[0]):
            links = dict(zip(peers, cells[1:1 + len(peers)]))
            matrix[cells[0]] = {peer: link for peer, link in links.items() if link != "X"}
    return matrix


def hca(sys_root, name):
    base = os.path.join(sys_root, "class", "infiniband", name)
    verbs_dir = os.path.join(base, "device", "infiniband_verbs")
    verbs = sorted(os.listdir(verbs_dir)) if os.path.isdir(verbs_dir) else []
    ports_dir = os.path.join(base, "ports")
    ports = []
    for port in sorted(os.listdir(ports_dir) if os.path.isdir(ports_dir) else [], key=natural_key):
        state = read_text(os.path.join(ports_dir, port, "state"))
        ports.append({
            "port": int(port),
            "state": state.partition(": ")[2] or state,
            "link_layer": read_text(os.path.join(ports_dir, port, "link_layer")),
            "rate": read_text(os.path.join(ports_dir, port, "rate")),
        })
    info = {key: read_text(os.path.join(base, key))
            for key in ("hca_type", "board_id", "fw_ver", "node_guid")}
    return dict(info, name=name, uverbs=verbs[0] if verbs else "", ports=ports)


def hcas(sys_root):
    base = os.path.join(sys_root, "class", "infiniband")
    names = sorted(os.listdir(base), key=natural_key) if os.path.isdir(base) else []
    return [hca(sys_root, name) for name in names]


def topology(module, nvidia_smi):
    rc, out, err = module.run_command([nvidia_smi, "topo", "-m"])
    if rc != 0:
        module.warn(f"{nvidia_smi} topo -m failed ({(err or out).strip()}): no GPU topology")
        return {}
    return parse_topology(out)


def find_nvidia_smi(module):
    wanted = module.params["nvidia_smi"]
    if wanted is None:
        return module.get_bin_path("nvidia-smi")
    if wanted and not os.access(wanted, os.X_OK):
        module.fail_json(
            msg=f"berth_hardware_facts: nvidia_smi: {wanted} is not an executable file")
    return wanted or None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            proc_root=dict(type="path", default="/proc"),
            sys_root=dict(type="path", default="/sys"),
            nvidia_smi=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    for option in ("proc_root", "sys_root"):
        if not os.path.isdir(module.params[option]):
            module.fail_json(
                msg=f"berth_hardware_facts: {option}: {module.params[option]} is not a directory")
    nvidia_smi = find_nvidia_smi(module)
    try:
        gpu_list = gpus(module.params["proc_root"])
    except (OSError, ValueError) as e:
        module.fail_json(msg=f"berth_hardware_facts: {e}")
    matrix = topology(module, nvidia_smi) if gpu_list and nvidia_smi else {}
    hca_list = hcas(module.params["sys_root"])
    module.exit_json(changed=False, ansible_facts={
        "berth_gpu_count": len(gpu_list),
        "berth_gpus": gpu_list,
        "berth_nvidia_driver_version": driver_version(module.params["proc_root"]),
        "berth_gpu_topology": matrix,
        "berth_nvlink": any(link.startswith("NV")
                            for links in matrix.values() for link in links.values()),
        "berth_ib_count": len(hca_list),
        "berth_ib_hcas": hca_list,
    })


if __name__ == "__main__":
    main()
