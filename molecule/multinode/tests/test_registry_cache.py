"""The pull-through registry cache and the nodes' registry rules on the
deployed cluster.

berth-upstream stands in for a public registry: it is on its own Docker
network, which only berth-ctl (the registry_cache host)
joins. The nodes' rules (inventories/local/group_vars) send short names to
berth-upstream:5000, whose mirrors are the cache on berth-ctl:510 (put
first by the role), then the plain local registry on berth-ctl:5000.
"""

import collections
import json
import os
import re
import shlex
import subprocess
import time

import yaml

from conftest import COMPUTE, CONTROLLER, NODES, PROJECT, inventory_copy, node, play

UPSTREAM = "berth-upstream"
CACHE = f"{CONTROLLER}:510"
LOCAL = f"{CONTROLLER}:5000"
CACHE_UNIT = "berth-registry-cache@upstream.service"
LOCAL_UNIT = "docker-registry.service"
SHORT_NAME = "berth/mpi-test:1"
SECRETS = yaml.safe_load((PROJECT / "inventories/local/group_vars/all/vault.yml").read_text())
BLOB_GET = re.compile(r'"GET /v2/berth/mpi-test/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" 200 ')


def srun(args, user="alice"):
    return node(CONTROLLER).run(f"runuser -u {user} -- srun {args}")


def berth(host, args):
    return node(host).run(f"runuser -u alice -- berth {args}")


def now():
    """A point in the registries' logs: every container shares the host's clock."""
    mark = int(time.time())
    time.sleep(1.1)
    return mark


def log_since(host, unit, mark):
    return node(host).check_output(f"journalctl -u {unit} --since=@{mark} -o cat --no-pager")


def blob_gets(log):
    return collections.Counter(BLOB_GET.findall(log))


def restart_cache_and_local():
    ctl = node(CONTROLLER)
    ctl.run(f"systemctl start {CACHE_UNIT} {LOCAL_UNIT}")
    for port in (5000, 510):
        ctl.run(f"for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.2; done")


def test_compute_nodes_have_no_route_to_the_upstream():
    ctl = node(CONTROLLER)
    address = ctl.check_output(f"getent hosts {UPSTREAM}").split()[0]
    probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/5000'"
    assert ctl.run(probe).rc == 0, "the cache host must reach the upstream"
    for name in COMPUTE:
        host = node(name)
        assert host.run(f"getent hosts {UPSTREAM}").rc != 0
        assert host.run(probe).rc != 0, f"{name} reaches {address}:5000"


def test_nodes_rules_put_the_cache_first():
    for name in [CONTROLLER, *COMPUTE]:
        plan = berth(name, f"import --dry-run docker://{SHORT_NAME}")
        assert plan.rc == 0, plan.stderr
        hosts = [line.split("/")[0] for line in plan.stdout.splitlines()]
        assert hosts == [CACHE, LOCAL, f"{UPSTREAM}:5000"], plan.stdout
        conf = node(name).file("/etc/enroot/registries.conf")
        assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o644)


def test_size_limit_empties_an_instance_over_it():
    ctl = node(CONTROLLER)
    storage = "/var/lib/berth-registry-cache/upstream"
    timer = ctl.run("systemctl is-enabled berth-registry-cache-prune.timer")
    assert timer.stdout.strip() == "enabled"
    ctl.check_output(f"install -o docker-registry -d {storage}/docker && "
                     f"head -c 4096 /dev/zero > {storage}/docker/filler")
    kept = ctl.run(f"/usr/local/sbin/berth-registry-cache-prune {10 ** 9} upstream")
    assert kept.rc == 0 and kept.stdout == "", kept.stderr
    assert ctl.file(f"{storage}/docker/filler").exists
    emptied = ctl.run("/usr/local/sbin/berth-registry-cache-prune 0 upstream")
    assert emptied.rc == 0, emptied.stderr
    assert "upstream:" in emptied.stdout and "emptied" in emptied.stdout
    assert ctl.check_output(f"ls -A {storage}") == ""
    assert ctl.service(CACHE_UNIT).is_running


def _clear_node_caches():
    for name in COMPUTE:
        uid = node(name).check_output("id -u alice")
        node(name).check_output(f"rm -rf /var/lib/berth/cache/{uid}/*")


def _variant_on(nodes):
    job = srun(f"-N{len(nodes)} -w {','.join(nodes)} --ntasks-per-node=1 --container-image={SHORT_NAME} "
               "sh -c 'echo $(hostname) $(grep ^VARIANT_ID= /etc/os-release)'")
    assert job.rc == 0, job.stdout + job.stderr
    assert sorted(job.stdout.splitlines()) == [f"{name} VARIANT_ID=berth-mpi-test" for name in nodes]


def test_srun_short_name_on_both_nodes_through_the_cache_which_fetches_each_blob_only_to_fill():
    # A cold cache, and no copy in alice's image caches on the nodes.
    node(CONTROLLER).check_output("/usr/local/sbin/berth-registry-cache-prune 0 upstream")
    restart_cache_and_local()
    _clear_node_caches()

    # Cold, one node: registry 2.8 fetches a blob it does not hold twice from
    # upstream (one stream to the client, one to its storage, both in
    # registry/proxy/proxyblobstore.go ServeBlob), never more for one client.
    mark = now()
    _variant_on(COMPUTE[:1])
    served = blob_gets(log_since(CONTROLLER, CACHE_UNIT, mark))
    fetched = blob_gets(log_since(UPSTREAM, LOCAL_UNIT, mark))
    assert served and all(count == 1 for count in served.values()), served
    assert fetched == {digest: 2 for digest in served}, (fetched, served)

    # Warm, both nodes: each node takes each blob from the cache, and the
    # upstream is asked for no blob at all.
    _clear_node_caches()
    mark = now()
    _variant_on(COMPUTE)
    assert blob_gets(log_since(CONTROLLER, CACHE_UNIT, mark)) == {digest: len(COMPUTE) for digest in served}
    assert blob_gets(log_since(UPSTREAM, LOCAL_UNIT, mark)) == {}
    assert blob_gets(log_since(CONTROLLER, LOCAL_UNIT, mark)) == {}, "the second mirror was used"


def test_with_the_cache_stopped_the_second_mirror_serves():
    ctl = node(CONTROLLER)
    try:
        ctl.check_output(f"systemctl stop {CACHE_UNIT}")
        mark = now()
        imported = berth(COMPUTE[0], f"import --cache-only docker://{SHORT_NAME}")
        assert imported.rc == 0, imported.stderr
        assert CACHE in imported.stderr, imported.stderr
        assert re.search(r"GET /v2/berth/mpi-test/manifests/1 ", log_since(CONTROLLER, LOCAL_UNIT, mark))
    finally:
        restart_cache_and_local()


def test_while_the_cache_restarts_no_user_can_answer_on_its_port():
    """The size timer stops and starts the cache. On a port any user could
    bind (the role's old 5100), alice, who logs in to this host, could
    answer the nodes' plain-HTTP pulls with her own images meanwhile."""
    ctl = node(CONTROLLER)
    port = CACHE.rsplit(":", 1)[1]
    bind = f"runuser -u alice -- python3 -c 'import socket; socket.socket().bind((\"\", {port}))'"
    try:
        ctl.check_output(f"systemctl stop {CACHE_UNIT}")
        taken = ctl.run(bind)
        assert taken.rc == 1 and "PermissionError: [Errno 13] Permission denied" in taken.stderr
    finally:
        restart_cache_and_local()
    listening = ctl.check_output(f"ss -Hltnp 'sport = :{port}'")
    assert '"docker-registry"' in listening, listening


def test_with_every_entry_down_the_error_names_each_place_tried():
    ctl = node(CONTROLLER)
    try:
        ctl.check_output(f"systemctl stop {CACHE_UNIT} {LOCAL_UNIT}")
        imported = berth(COMPUTE[0], f"import --cache-only docker://{SHORT_NAME}")
        assert imported.rc != 0
        last = imported.stderr.strip().splitlines()[-1]
        for place in (CACHE, LOCAL, f"{UPSTREAM}:5000"):
            assert place in last, last
    finally:
        restart_cache_and_local()


def test_blocked_prefix_is_refused_before_any_request_naming_the_rule():
    mark = now()
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image=blocked/app:1 true")
    assert job.rc != 0
    assert "berth-upstream:5000/blocked" in job.stdout + job.stderr, job.stdout + job.stderr
    imported = berth(COMPUTE[1], "import docker://blocked/app:1")
    assert imported.rc != 0
    assert "'berth-upstream:5000/blocked'" in imported.stderr, imported.stderr
    assert "/etc/enroot/registries.conf:" in imported.stderr, imported.stderr
    for host, unit in ((CONTROLLER, CACHE_UNIT), (CONTROLLER, LOCAL_UNIT), (UPSTREAM, LOCAL_UNIT)):
        assert "blocked/app" not in log_since(host, unit, mark), f"{host} {unit} was asked"


def _copy_between(source_host, source, target_host, target):
    reader = subprocess.Popen(["docker", "exec", source_host, "cat", source], stdout=subprocess.PIPE)
    subprocess.run(["docker", "exec", "-i", target_host, "sh", "-c", f"cat > {shlex.quote(target)}"],
                   stdin=reader.stdout, check=True)
    assert reader.wait() == 0


def test_saved_images_import_and_run_on_a_node_without_any_network():
    ctl, cn = node(CONTROLLER), node(COMPUTE[0])
    # docker save (scripts/test-image.sh made mpi-test.tar so on the host) and
    # skopeo's oci-archive, made on the controller and carried over as a file.
    ctl.check_output("rm -f /root/mpi-test-oci.tar && skopeo copy -q docker-archive:/opt/berth-images/mpi-test.tar "
                     "oci-archive:/root/mpi-test-oci.tar:berth/mpi-test:1")
    _copy_between(CONTROLLER, "/root/mpi-test-oci.tar", COMPUTE[0], "/home/alice/mpi-test-oci.tar")
    cn.check_output("chown alice: /home/alice/mpi-test-oci.tar")
    # No network at all: a network namespace of its own, loopback only.
    offline = "unshare --net runuser -u alice -- berth"
    assert cn.run(f"{offline} import --cache-only docker://{CONTROLLER}:5000#berth/mpi-test:1").rc != 0
    try:
        for uri, image in (("docker-archive:/opt/berth-images/mpi-test.tar", "/home/alice/air-docker.sqsh"),
                           ("oci-archive:/home/alice/mpi-test-oci.tar:berth/mpi-test:1", "/home/alice/air-oci.sqsh")):
            imported = cn.run(f"rm -f {image} && {offline} -q import -o {image} {uri}")
            assert imported.rc == 0, imported.stderr
            started = cn.run(f"{offline} start {image} grep ^VARIANT_ID= /etc/os-release")
            assert started.rc == 0, started.stderr
            assert started.stdout.strip() == "VARIANT_ID=berth-mpi-test"
            # srun checks the file on the login node: homes are shared on a
            # real cluster, not here, so the file goes there too.
            _copy_between(COMPUTE[0], image, CONTROLLER, image)
            ctl.check_output(f"chown alice: {image}")
            job = srun(f"-N1 -w {COMPUTE[0]} --container-image={image} grep ^VARIANT_ID= /etc/os-release")
            assert job.rc == 0, job.stderr
            assert job.stdout.strip() == "VARIANT_ID=berth-mpi-test"
    finally:
        for host in (cn, ctl):
            host.run("rm -f /home/alice/air-docker.sqsh /home/alice/air-oci.sqsh /home/alice/mpi-test-oci.tar")


def test_credentials_files_are_0600_and_hold_the_secrets():
    config = node(CONTROLLER).file("/etc/docker/registry/berth-cache/upstream.yml")
    assert (config.user, config.mode) == ("docker-registry", 0o600)
    assert SECRETS["vault_berth_upstream_password"] in config.content_string
    for name in NODES:
        credentials = node(name).file("/home/alice/.config/enroot/.credentials")
        assert (credentials.user, credentials.mode) == ("alice", 0o600), name
        assert (f"machine {LOCAL} login alice password {SECRETS['vault_alice_registry_password']}"
                in credentials.content_string)
        directory = node(name).file("/home/alice/.config/enroot")
        assert (directory.user, directory.mode) == ("alice", 0o700)


def _logs_hold(secret):
    """The hosts where a secret shows in the journal or under /var/log."""
    found = []
    for name in [*NODES, UPSTREAM]:
        host = node(name)
        quoted = shlex.quote(secret)
        if host.run(f"journalctl -o cat --no-pager | grep -qF -- {quoted}").rc == 0:
            found.append(f"{name}: journal")
        if host.run(f"grep -rqF -- {quoted} /var/log").rc == 0:
            found.append(f"{name}: /var/log")
    return found


def test_secrets_are_in_no_log():
    for secret in SECRETS.values():
        assert _logs_hold(secret) == []


def test_check_diff_of_changed_secrets_shows_neither_secret(tmp_path):
    new = {key: f"{value}-rotated" for key, value in SECRETS.items()}
    args = [arg for key, value in new.items() for arg in ("-e", f"{key}={value}")]
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory_copy(tmp_path)), "playbooks/registry_cache.yml",
         "playbooks/containers.yml", "--check", "--diff", "-v", "--limit", CONTROLLER, *args],
        cwd=PROJECT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    recap = dict(re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M))
    # berth-ctl is the cache and a login node: the cache's configuration and
    # restart, and alice's .credentials, each changed and shown without text.
    assert int(recap[CONTROLLER]) >= 3, recap
    for secret in [*SECRETS.values(), *new.values()]:
        assert secret not in output
    for secret in new.values():
        assert _logs_hold(secret) == []
    # Check mode: the files still hold the old secrets.
    test_credentials_files_are_0600_and_hold_the_secrets()


def test_malformed_rule_is_refused_before_any_change(tmp_path):
    before = node(COMPUTE[0]).check_output("sha256sum /etc/enroot/registries.conf")
    bad = {"container_runtime_registries": [{"prefix": "berth-upstream:5000", "mirrors": [{"url": "x:1"}]}]}
    rc, output, recap = play(inventory_copy(tmp_path), "-e", json.dumps(bad))
    assert rc != 0
    assert "container_runtime_registries[0].mirrors[0].url: unsupported [[registry.mirror]] key 'url'" in output, output[-3000:]
    assert all(changed == 0 for changed in recap.values()), recap
    assert node(COMPUTE[0]).check_output("sha256sum /etc/enroot/registries.conf") == before
