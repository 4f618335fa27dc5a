#!/usr/bin/env python3
"""What a no-op `site.yml` run costs, by connection and number of hosts.

    python3 bench/site_noop.py [--runs N] [--no-ssh]

Runs on the converged demo cluster (`bash scripts/demo.sh`): berth-ctl,
berth-cn1, berth-cn2. Every run must report changed=0 on every host, or the
benchmark stops. Rows, N runs each, min / median in seconds:
  docker, 3 hosts                      the baseline: Ansible's own strategy
  docker, 3 hosts, berth_validate=false   without the validation play's MPI job
  docker, --limit 1 host / 2 hosts     how the run grows with the hosts it manages
  docker, 3 hosts, Mitogen             strategy mitogen_linear (plugins/strategy):
                                       one Python per host for the whole run
  docker, 3 hosts (Mitogen), python named   the same two with the nodes' Python
                                       named (/usr/bin/python3, as the Molecule
                                       scenario does), not discovered
  ssh, 3 hosts                         OpenSSH, as on real nodes: pipelining and
                                       ControlPersist, as ansible.cfg sets them;
                                       and the same with Mitogen
For the ssh row the benchmark installs openssh-server into the three node
containers (from the node's package mirror), authorizes a key it makes for
root, and reaches the nodes at their addresses on the Docker network.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
NODES = {"berth-ctl": ["slurm_controller", "slurm_login", "registry_cache"],
         "berth-cn1": ["slurm_compute"], "berth-cn2": ["slurm_compute"]}
RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def inventory(directory, connection, key=None):
    """An inventory of the three nodes with the scenario's group_vars."""
    directory.mkdir()
    os.symlink(PROJECT / "inventories/local/group_vars", directory / "group_vars")
    lines = ["all:", "  children:"]
    groups = sorted({group for groups in NODES.values() for group in groups})
    for group in groups:
        lines += [f"    {group}:", "      hosts:"]
        for name, member_of in NODES.items():
            if group in member_of:
                lines.append(f"        {name}:")
    lines += ["  vars:"]
    if connection == "docker":
        # the short name: Mitogen takes over only connections it knows by it
        lines.append("    ansible_connection: docker")
    else:
        lines += ["    ansible_connection: ssh", "    ansible_user: root",
                  f"    ansible_ssh_private_key_file: {key}",
                  "    ansible_ssh_common_args: >-",
                  "      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                  "      -o ControlMaster=auto -o ControlPersist=60s", "  hosts:"]
        for name in NODES:
            lines += [f"    {name}:", f"      ansible_host: {address(name)}"]
    (directory / "hosts.yml").write_text("\n".join(lines) + "\n")
    return directory / "hosts.yml"


def address(name):
    return subprocess.run(
        ["docker", "inspect", "-f", "{{(index .NetworkSettings.Networks \"berth-net\").IPAddress}}",
         name], capture_output=True, text=True, check=True).stdout.strip()


def on_node(name, script):
    subprocess.run(["docker", "exec", "-i", name, "sh", "-ec", script], check=True,
                   stdout=subprocess.DEVNULL)


def enable_ssh(work):
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    for name in NODES:
        on_node(name, "command -v sshd >/dev/null || { apt-get update -qq && "
                      "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                      "--no-install-recommends openssh-server >/dev/null; }; "
                      "install -d -m 0700 /root/.ssh; "
                      f"grep -qxF '{public}' /root/.ssh/authorized_keys 2>/dev/null || "
                      f"echo '{public}' >>/root/.ssh/authorized_keys; "
                      "chmod 0600 /root/.ssh/authorized_keys; systemctl start ssh")
    return key


def run(hosts_file, *args, strategy="linear", python=None):
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_STRATEGY=strategy)
    env.pop("ANSIBLE_PYTHON_INTERPRETER", None)
    if python:  # the config setting: the implicit localhost keeps Ansible's own Python
        env["ANSIBLE_PYTHON_INTERPRETER"] = python
    started = time.perf_counter()
    result = subprocess.run(["ansible-playbook", "-i", str(hosts_file), "site.yml", *args],
                            cwd=PROJECT, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    recap = RECAP.findall(output)
    busy = [host for host, changed, unreachable, failed in recap
            if (changed, unreachable, failed) != ("0", "0", "0")]
    if result.returncode != 0 or not recap or busy:
        sys.exit(f"site_noop: {' '.join(args) or 'site.yml'} was no no-op run "
                 f"(rc {result.returncode}, hosts {busy}):\n{output[-2000:]}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-ssh", action="store_true", help="leave out the ssh row")
    options = parser.parse_args()
    for tool in ("docker", "ansible-playbook", "ssh-keygen"):
        if not shutil.which(tool):
            sys.exit(f"site_noop: {tool} not found (the dev venv's bin on PATH?)")
    with tempfile.TemporaryDirectory(prefix="berth-noop-") as tmp:
        work = Path(tmp)
        docker = inventory(work / "docker", "docker")
        mitogen = {"strategy": "mitogen_linear"}  # plugins/strategy, mitogen in the venv
        named = {"python": "/usr/bin/python3"}  # Debian's, on every node
        rows = [("docker, 3 hosts (baseline)", docker, (), {}),
                ("docker, 3 hosts, berth_validate=false", docker,
                 ("-e", "berth_validate=false"), {}),
                ("docker, --limit berth-ctl (1 host)", docker, ("--limit", "berth-ctl"), {}),
                ("docker, --limit berth-ctl,berth-cn1 (2)", docker,
                 ("--limit", "berth-ctl,berth-cn1"), {}),
                ("docker, 3 hosts, Mitogen", docker, (), mitogen),
                ("docker, 3 hosts, python named", docker, (), named),
                ("docker, 3 hosts, Mitogen, python named", docker, (), {**mitogen, **named})]
        if not options.no_ssh:
            ssh = inventory(work / "ssh", "ssh", enable_ssh(work))
            rows += [("ssh, 3 hosts", ssh, (), {}), ("ssh, 3 hosts, Mitogen", ssh, (), mitogen)]
        samples = {label: [] for label, *_ in rows}
        for _ in range(options.runs):  # in turns: a change in the machine's speed hits all rows
            for label, hosts_file, args, settings in rows:
                samples[label].append(run(hosts_file, *args, **settings))
    baseline = statistics.median(samples[rows[0][0]])
    print(f"{'no-op site.yml run':44} {'min s':>7} {'median s':>9} {'vs baseline':>12}")
    for label, *_ in rows:
        times = samples[label]
        median = statistics.median(times)
        print(f"{label:44} {min(times):7.1f} {median:9.1f} {median / baseline:11.2f}x")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores)")


if __name__ == "__main__":
    main()
