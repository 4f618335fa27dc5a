"""Accounting on the converged cluster: slurmdbd on MariaDB (berth-ctl), the
inventory's accounts, enforcement, and which image each step ran."""

import os
import re
import shlex
import subprocess
import time

import pytest
import yaml

from conftest import COMPUTE, CONTROLLER, NODES, PROJECT, inventory_copy, node, play

IMAGE_SQSH = "/opt/berth-images/mpi-test.sqsh"
REGISTRY_IMAGE = f"{CONTROLLER}:5000#berth/mpi-test:1"
LOCAL = yaml.safe_load((PROJECT / "inventories/local/group_vars/all/main.yml").read_text())
SECRET = yaml.safe_load((PROJECT / "inventories/local/group_vars/all/vault.yml").read_text())[
    "vault_slurm_dbd_storage_password"]
STRANGER = ("eve", 2010)  # a user with no association


def ctl(command):
    return node(CONTROLLER).run(command)


def sbatch_wait(script, user="alice"):
    """Submit `script` on two nodes, wait for its end; (job id, exit code)."""
    result = ctl(f"cd /tmp && runuser -u {user} -- sbatch --parsable -W -N2 -o /dev/null "
                 f"--wrap {shlex.quote(script)}")
    match = re.match(r"(\d+)", result.stdout.strip())
    assert match, result.stdout + result.stderr
    return match[1], result.rc


def sacct_rows(job_id, fields, want=lambda rows: True):
    """sacct's rows of a job (records reach slurmdbd asynchronously: waits up to 60 s)."""
    rows = []
    for _ in range(60):
        out = ctl(f"sacct -n -P -j {job_id} -o {fields}").stdout  # the job and its steps
        rows = [line.split("|") for line in out.splitlines() if line]
        if want(rows):
            return rows
        time.sleep(1)
    return rows


def test_slurmdbd_and_mariadb_run_on_the_controller():
    host = node(CONTROLLER)
    assert host.service("slurmdbd").is_running and host.service("slurmdbd").is_enabled
    assert host.service("mariadb").is_running and host.service("mariadb").is_enabled
    conf = host.file("/etc/slurm/slurmdbd.conf")
    assert (conf.user, conf.group, conf.mode) == ("slurm", "slurm", 0o600)
    assert f"StoragePass={SECRET}" in conf.content_string
    # MariaDB is not reachable from the other nodes
    listening = host.check_output("ss -Hltn")
    assert re.search(r"127\.0\.0\.1:3306\b", listening), listening
    assert not re.search(r"(0\.0\.0\.0|\*|\[::\]):3306\b", listening), listening
    for name in COMPUTE:
        assert not node(name).package("mariadb-server").is_installed
    # slurm.conf points every node at it
    for name in NODES:
        text = node(name).file("/etc/slurm/slurm.conf").content_string
        assert "AccountingStorageType=accounting_storage/slurmdbd" in text
        assert f"AccountingStorageHost={CONTROLLER}" in text
        assert "AccountingStorageEnforce=associations,limits,qos" in text


def test_the_cluster_and_the_inventorys_accounts_are_registered():
    clusters = ctl("sacctmgr -n -P show cluster format=cluster").stdout.split()
    assert clusters == ["berth"]
    associations = set(ctl("sacctmgr -n -P show association cluster=berth format=account,user")
                       .stdout.split())
    for account, entry in LOCAL["slurm_accounts"].items():
        assert account + "|" in associations
        for user in entry["users"]:
            assert f"{account}|{user}" in associations


def test_container_jobs_are_recorded_with_their_steps():
    job_id, rc = sbatch_wait(f"srun --container-image={IMAGE_SQSH} true && "
                             f"srun --container-image={IMAGE_SQSH} --container-workdir=/tmp true")
    assert rc == 0
    rows = sacct_rows(job_id, "JobID,State,User,Account",
                      lambda rows: {f"{job_id}.0", f"{job_id}.1"} <= {r[0] for r in rows})
    states = {row[0]: row[1] for row in rows}
    assert states.get(job_id) == "COMPLETED", rows
    assert states.get(f"{job_id}.batch") == "COMPLETED", rows
    assert states.get(f"{job_id}.0") == "COMPLETED" and states.get(f"{job_id}.1") == "COMPLETED", rows
    job = next(row for row in rows if row[0] == job_id)
    assert job[2:] == ["alice", "research"], job
    submit = sacct_rows(job_id, "JobID,SubmitLine")
    assert any(row[0] == f"{job_id}.0" and f"--container-image={IMAGE_SQSH}" in row[1]
               for row in submit), submit


def test_which_image_a_job_ran_is_in_the_nodes_log_with_its_digest():
    # what the tag names now: the job resolves it once, and every node runs that digest
    pinned = node(CONTROLLER).check_output(
        f"runuser -u alice -- berth import --resolve docker://{REGISTRY_IMAGE}")
    digest = pinned.rpartition("@")[2]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), pinned
    job_id, rc = sbatch_wait(f"srun --container-image={REGISTRY_IMAGE} true")
    assert rc == 0
    line = (f"spank_berth: step {job_id}.0 of uid 2001 runs image "
            f"docker://{REGISTRY_IMAGE} digest {digest}")
    for name in COMPUTE:  # one line per node the step ran on, in slurmd's log
        log = node(name).run(f"grep -F {shlex.quote(line)} /var/log/slurm/slurmd.log")
        assert log.rc == 0, f"{name}: no '{line}'"


@pytest.fixture
def stranger():
    name, uid = STRANGER
    for host in NODES:
        if node(host).run(f"id -u {name}").rc != 0:
            node(host).check_output(f"useradd -m -u {uid} -s /bin/bash {name}")
    return name


def test_a_user_without_an_association_is_refused(stranger):
    before = ctl("squeue -h -a -t all -o %i").stdout.split()
    result = ctl(f"cd /tmp && runuser -u {stranger} -- srun -N1 true")
    assert result.rc != 0
    assert "Invalid account or account/partition combination" in result.stderr, result.stderr
    assert set(ctl("squeue -h -a -t all -o %i").stdout.split()) <= set(before)
    # alice, who has one, runs
    assert ctl("cd /tmp && runuser -u alice -- srun -N1 true").rc == 0


def test_check_diff_of_a_new_database_password_shows_no_secret(tmp_path):
    rotated = f"{SECRET}-rotated"
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory_copy(tmp_path)), "playbooks/accounting.yml",
         "--check", "--diff", "-v", "-e", f"vault_slurm_dbd_storage_password={rotated}"],
        cwd=PROJECT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    recap = dict(re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M))
    assert int(recap[CONTROLLER]) >= 2, recap  # the account's password and slurmdbd.conf
    assert SECRET not in output and rotated not in output
    assert f"StoragePass={SECRET}" in node(CONTROLLER).file("/etc/slurm/slurmdbd.conf").content_string


def test_a_short_database_password_is_refused_before_any_change(tmp_path):
    before = node(CONTROLLER).check_output("sha256sum /etc/slurm/slurmdbd.conf")
    rc, output, recap = play(inventory_copy(tmp_path), "-e", "vault_slurm_dbd_storage_password=short")
    assert rc != 0
    assert "slurm_dbd_storage_password: set it (Ansible Vault) to 8 or more characters" in output
    assert all(changed == 0 for changed in recap.values()), recap
    assert node(CONTROLLER).check_output("sha256sum /etc/slurm/slurmdbd.conf") == before


def test_a_bad_account_is_refused_before_any_change(tmp_path):
    rc, output, recap = play(inventory_copy(tmp_path), "-e",
                             '{"slurm_accounts": {"Research": {"users": ["alice"]}}}')
    assert rc != 0
    assert "slurm_accounts.Research: expected a lower-case account name" in output
    assert all(changed == 0 for changed in recap.values()), recap
