"""site.yml on the converged cluster: check mode changes nothing, and bad
inventories stop the play before any host changes."""

import base64
import os

import yaml

from conftest import COMPUTE, CONTROLLER, NODES, RUNTIME_PLAY, inventory_copy, node, play


def slurm_conf_digests():
    return {name: node(name).check_output("sha256sum /etc/slurm/slurm.conf") for name in NODES}


def test_check_diff_reports_no_change(tmp_path):
    rc, output, recap = play(inventory_copy(tmp_path), "--check", "--diff")
    assert rc == 0, output[-3000:]
    assert recap and set(recap) >= set(NODES), output[-3000:]
    assert all(changed == 0 for changed in recap.values()), recap


def test_the_preflight_for_a_site_slurm_reads_this_slurms_prolog(tmp_path):
    """playbooks/preflight.yml as for a Slurm the site owns, against this
    cluster's real Slurm (22.05 on Debian 12; 24.11 on Debian 13, whose
    scontrol numbers the Prolog lines). Its Prolog is the slurm role's
    dispatcher, which runs prolog.d: scontrol cannot show that, so the
    preflight refuses it until the admin says so."""
    version = node(CONTROLLER).check_output("scontrol --version").split()[-1]
    inventory = inventory_copy(tmp_path)
    rc, output, recap = play(inventory, "-e", "berth_slurm_managed=false",
                             playbook="playbooks/preflight.yml")
    assert rc != 0
    assert ("slurm.conf: Prolog=/etc/slurm/prolog.sh does not run "
            "/etc/slurm/prolog.d/50-berth-user-dirs.sh") in output, output[-3000:]
    several = tuple(map(int, version.split(".")[:2])) >= (24, 11)
    assert ("Add a line Prolog=/etc/slurm/prolog.d/*" if several
            else "Make Prolog a glob that matches it") in output, output[-3000:]
    rc, output, recap = play(inventory, "-e", "berth_slurm_managed=false",
                             "-e", '{"adopt_site_prolog_runs_prolog_dir": true}',
                             playbook="playbooks/preflight.yml")
    assert rc == 0, output[-3000:]
    assert "(Prolog /etc/slurm/prolog.sh runs /etc/slurm/prolog.d/50-berth-user-dirs.sh)" in output
    assert all(changed == 0 for changed in recap.values()), recap


def test_node_line_that_contradicts_facts_stops_every_host(tmp_path):
    inventory = inventory_copy(tmp_path)
    host_vars = inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / "berth-cn2.yml").write_text(yaml.safe_dump({"slurm_cpus": 999}))
    before = slurm_conf_digests()
    rc, output, recap = play(inventory)
    assert rc != 0
    assert "berth-cn2: slurm_cpus=999 in the inventory, but the host has" in output
    assert all(changed == 0 for changed in recap.values()), recap
    assert slurm_conf_digests() == before


def test_munge_key_of_the_wrong_size_is_refused(tmp_path):
    short_key = base64.b64encode(os.urandom(16)).decode()
    before = node(CONTROLLER).check_output("sha256sum /etc/munge/munge.key")
    rc, output, recap = play(inventory_copy(tmp_path), "-e", f"munge_key_b64={short_key}")
    assert rc != 0
    assert "key_b64 decodes to 16 bytes; munged needs 32 to 1024 bytes" in output
    assert short_key not in output
    assert all(changed == 0 for changed in recap.values()), recap
    assert node(CONTROLLER).check_output("sha256sum /etc/munge/munge.key") == before


def test_bad_cache_size_limit_is_refused_before_any_change(tmp_path):
    before = node(COMPUTE[0]).check_output("sha256sum /usr/local/sbin/berth-cache-prune")
    rc, output, recap = play(inventory_copy(tmp_path), "-e", "container_runtime_cache_max_size=twentyG")
    assert rc != 0
    assert "container_runtime_cache_max_size=twentyG: expected bytes or a size" in output
    assert all(changed == 0 for changed in recap.values()), recap
    assert node(COMPUTE[0]).check_output("sha256sum /usr/local/sbin/berth-cache-prune") == before


def test_a_cap_of_the_store_systemd_cannot_read_is_refused_before_any_change(tmp_path):
    rc, output, recap = play(inventory_copy(tmp_path), "-e", "container_runtime_image_store=/shared/x",
                             "-e", "container_runtime_image_store_cpu_quota=lots")
    assert rc != 0
    assert "container_runtime_image_store_cpu_quota=lots," in output
    assert "expected a percentage such as 100% (one core)" in output
    assert all(changed == 0 for changed in recap.values()), recap
    assert not node(COMPUTE[0]).file("/shared/x").exists


def test_inventory_without_compute_group_is_refused(tmp_path):
    inventory = inventory_copy(tmp_path)
    hosts_file = inventory / "ansible_inventory.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    hosts.pop("slurm_compute")
    hosts_file.write_text(yaml.safe_dump(hosts))
    rc, output, recap = play(inventory)
    assert rc != 0
    assert "group 'slurm_compute' at least one (has 0)" in output
    assert all(changed == 0 for changed in recap.values()), recap


def test_unsetting_the_cache_limits_removes_the_prune_timer(tmp_path):
    host = node(COMPUTE[1])
    inventory = inventory_copy(tmp_path)
    try:
        rc, output, recap = play(inventory, "--limit", COMPUTE[1],
                                 "-e", "container_runtime_cache_max_age_days=0", playbook=RUNTIME_PLAY)
        assert rc == 0, output[-3000:]
        assert recap[COMPUTE[1]] > 0
        for path in ("/etc/systemd/system/berth-cache-prune.timer",
                     "/etc/systemd/system/berth-cache-prune.service",
                     "/usr/local/sbin/berth-cache-prune"):
            assert not host.file(path).exists, path
        assert host.run("systemctl is-active berth-cache-prune.timer").stdout.strip() != "active"
    finally:
        # the scenario's own settings
        rc, output, recap = play(inventory, "--limit", COMPUTE[1], playbook=RUNTIME_PLAY)
        assert rc == 0, output[-3000:]
    assert host.service("berth-cache-prune.timer").is_running
