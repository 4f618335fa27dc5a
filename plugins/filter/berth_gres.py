"""Slurm generic resources (GPUs) from berth_hardware_facts.

berth_gpu_type   'NVIDIA H100 80GB HBM3' -> 'h100': the Type= of a GPU model
berth_gres       berth_gpus -> 'gpu:h100:8', the Gres= value of a slurm.conf
                 NodeName line ('' for a node without GPUs)
berth_gres_conf  (berth_gpus, node name) -> gres.conf lines, e.g.
                 'NodeName=dgx01 Name=gpu Type=h100 File=/dev/nvidia[0-7]'

Slurm numbers a node's GPUs in the order gres.conf lists their files; the
lines keep the facts' index order (PCI bus order, nvidia-smi's), so Slurm's
GPU i, CUDA's and the NVIDIA hook's are the same device.
"""

import re
from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

# Brand words that say nothing about the chip.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
# Series words that need the next word to name a chip: "RTX A6000" -> rtx_a6000.
_SERIES_WORDS = {"rtx", "gtx", "titan"}


def berth_gpu_type(model):
    """The short, lower-case chip name Slurm users type in --gres=gpu:TYPE:N."""
    if not isinstance(model, str):
        raise AnsibleFilterError(f"berth_gpu_type: model must be a string, got {model!r}")
    words = [w for w in model.lower().split() if w not in _VENDOR_WORDS]
    if not words:
        raise AnsibleFilterError(f"berth_gpu_type: no chip name in GPU model {model!r}")
    chip = words[0].split("-")[0]
    if chip in _SERIES_WORDS and len(words) > 1:
        chip = f"{chip}_{words[1].split('-')[0]}"
    return re.sub(r"[^a-z0-9_]", "", chip)


def _checked(gpus):
    """The GPU list in index order, each entry with the keys the filters read."""
    if not isinstance(gpus, Sequence) or isinstance(gpus, str):
        raise AnsibleFilterError(
            f"berth_gres: expected the berth_gpus list, got {type(gpus).__name__}")
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, Mapping):
            raise AnsibleFilterError(f"berth_gres: GPU entry {position} is not a mapping: {gpu!r}")
        for key in ("index", "minor", "model"):
            if key not in gpu:
                raise AnsibleFilterError(
                    f"berth_gres: GPU entry {position} has no '{key}': {dict(gpu)!r}")
        if not isinstance(gpu["minor"], int) or gpu["minor"] < 0:
            raise AnsibleFilterError(
                f"berth_gres: GPU {gpu['index']} has a bad minor number {gpu['minor']!r}")
    return sorted(gpus, key=lambda gpu: gpu["index"])


def _by_type(gpus):
    """[(type, [GPU, ...])] in index order, one group per run of one type."""
    groups = []
    for gpu in _checked(gpus):
        gpu_type = berth_gpu_type(gpu["model"])
        if groups and groups[-1][0] == gpu_type:
            groups[-1][1].append(gpu)
        else:
            groups.append((gpu_type, [gpu]))
    return groups


def berth_gres(gpus):
    """Gres= of the node line: 'gpu:h100:8', 'gpu:a100:2,gpu:l40s:1', or ''."""
    counts = {}
    for gpu_type, members in _by_type(gpus):
        counts[gpu_type] = counts.get(gpu_type, 0) + len(members)
    return ",".join(f"gpu:{gpu_type}:{count}" for gpu_type, count in counts.items())


def _device_files(minors):
    """/dev/nvidia0, or /dev/nvidia[0-3,6] for several minors in rising order."""
    if len(minors) == 1:
        return f"/dev/nvidia{minors[0]}"
    ranges = []
    for minor in minors:
        if ranges and minor == ranges[-1][1] + 1:
            ranges[-1][1] = minor
        else:
            ranges.append([minor, minor])
    parts = [str(low) if low == high else f"{low}-{high}" for low, high in ranges]
    return f"/dev/nvidia[{','.join(parts)}]"


def berth_gres_conf(gpus, node_name):
    """gres.conf lines for one node: a line per run of one GPU type whose
    minors rise; where they do not, a line per GPU, so the order of the
    files stays the order of the indices."""
    if not isinstance(node_name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", node_name):
        raise AnsibleFilterError(f"berth_gres_conf: bad node name {node_name!r}")
    lines = []
    for gpu_type, members in _by_type(gpus):
        minors = [gpu["minor"] for gpu in members]
        runs = [minors] if minors == sorted(set(minors)) else [[minor] for minor in minors]
        for run in runs:
            lines.append(f"NodeName={node_name} Name=gpu Type={gpu_type} File={_device_files(run)}")
    return lines


class FilterModule:
    def filters(self):
        return {
            "berth_gpu_type": berth_gpu_type,
            "berth_gres": berth_gres,
            "berth_gres_conf": berth_gres_conf,
        }
