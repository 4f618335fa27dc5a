"""roles/container_runtime writes NVIDIA's CDI spec (tasks/nvidia_cdi.yml),
run through ansible-playbook on localhost with the paths moved under tmp_path.

No GPU is here: nvidia-ctk is a stand-in script that prints a spec naming
the driver version of a stand-in version file (the driver's
/proc/driver/nvidia/version), as the real one would print one spec per
driver and set of GPUs; it counts its runs.
"""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write NVIDIA's CDI spec
      ansible.builtin.include_role:
        name: container_runtime
        tasks_from: nvidia_cdi.yml
"""
NVIDIA_CTK = """#!/bin/sh
echo run >>"{node}/runs"
[ "$*" = "cdi generate" ] || {{ echo "nvidia-ctk stand-in: unexpected arguments: $*" >&2; exit 2; }}
version=$(cat "{node}/proc/version")
echo 'level=info msg="Generated CDI spec"' >&2
printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices:\\n- name: "0"\\n'
printf '  containerEdits:\\n    deviceNodes:\\n    - path: /dev/nvidia0\\n'
printf 'containerEdits:\\n  mounts:\\n  - hostPath: /usr/lib/libcuda.so.%s\\n' "$version"
"""


@pytest.fixture
def node(tmp_path):
    """A pretend GPU node: the stand-in nvidia-ctk and driver version file."""
    (tmp_path / "bin").mkdir()
    ctk = tmp_path / "bin/nvidia-ctk"
    ctk.write_text(NVIDIA_CTK.format(node=tmp_path))
    ctk.chmod(0o755)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/version").write_text("550.54.15\n")
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def apply(node, *options, **variables):
    """Run the tasks; return (exit status, changed count, output)."""
    variables = {
        "container_runtime_nvidia_ctk": str(node / "bin/nvidia-ctk"),
        "container_runtime_nvidia_driver_version_file": str(node / "proc/version"),
        "container_runtime_nvidia_cdi_spec": str(node / "etc/cdi/nvidia.yaml"),
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    (node / "vars.json").write_text(json.dumps(variables))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
           "-c", "local", "-e", f"@{node / 'vars.json'}", *options, str(node / "play.yml")]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), HOME=str(node),
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="false")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout)
    return done.returncode, int(recap.group(1)) if recap else None, done.stdout + done.stderr


def spec(node):
    return (node / "etc/cdi/nvidia.yaml").read_text()


def runs(node):
    path = node / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_spec_is_written_root_only_and_again_changes_nothing(node):
    status, changed, out = apply(node)
    assert (status, changed) == (0, 2), out  # its directory, then the spec
    assert "kind: nvidia.com/gpu\n" in spec(node)
    assert spec(node).endswith("hostPath: /usr/lib/libcuda.so.550.54.15\n")
    st = (node / "etc/cdi/nvidia.yaml").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)  # what the runtime trusts
    assert stat.S_IMODE((node / "etc/cdi").stat().st_mode) == 0o755
    status, changed, out = apply(node)
    assert (status, changed) == (0, 0), out


def test_a_new_driver_rewrites_it_and_check_says_so_first(node):
    assert apply(node)[0] == 0
    (node / "proc/version").write_text("570.86.10\n")
    status, changed, out = apply(node, "--check")
    assert (status, changed) == (0, 1), out
    assert "libcuda.so.550.54.15" in spec(node)  # --check wrote nothing
    status, changed, out = apply(node)
    assert (status, changed) == (0, 1), out
    assert "libcuda.so.570.86.10" in spec(node)


def test_a_missing_spec_is_written_again(node):
    assert apply(node)[0] == 0
    (node / "etc/cdi/nvidia.yaml").unlink()
    status, changed, out = apply(node)
    assert (status, changed) == (0, 1), out
    assert "kind: nvidia.com/gpu\n" in spec(node)


@pytest.mark.parametrize("missing", ["bin/nvidia-ctk", "proc/version"],
                         ids=["no-nvidia-ctk", "no-driver"])
def test_a_node_without_the_tool_or_the_driver_gets_nothing(node, missing):
    (node / missing).unlink()
    status, changed, out = apply(node)
    assert (status, changed) == (0, 0), out
    assert not (node / "etc/cdi").exists() and runs(node) == 0


def test_turned_off_it_leaves_the_spec_alone(node):
    (node / "etc/cdi").mkdir(parents=True)
    (node / "etc/cdi/nvidia.yaml").write_text("the site's own\n")
    status, changed, out = apply(node, container_runtime_nvidia_cdi_generate=False)
    assert (status, changed) == (0, 0), out
    assert spec(node) == "the site's own\n" and runs(node) == 0


def test_a_failing_nvidia_ctk_fails_the_run_and_keeps_the_old_spec(node):
    assert apply(node)[0] == 0
    before = spec(node)
    (node / "bin/nvidia-ctk").write_text("#!/bin/sh\necho 'failed to initialize NVML' >&2\nexit 1\n")
    status, _, out = apply(node)
    assert status != 0 and "failed to initialize NVML" in out
    assert spec(node) == before
