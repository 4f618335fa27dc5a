"""Root's code paths on a deployed node, attacked by a hostile user.

mallory owns her cache and home and points them at places she does not own:
root's daily cache prune and the Slurm prolog (`berth setup-user`) must act
as mallory there, or not at all, and never drain the node."""

import contextlib
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, node

NODE = COMPUTE[0]
HOSTILE = ("mallory", 2002)
VICTIM = ("victor", 2003)
LAYER = "ab" * 32  # a name the prune takes for a layer, so it opens the layer's lock


@pytest.fixture(scope="module", autouse=True)
def users():
    for name, uid in (HOSTILE, VICTIM):
        for host in NODES:
            if node(host).run(f"id -u {name}").rc != 0:
                node(host).check_output(f"useradd -m -u {uid} -s /bin/bash {name}")
    # mallory's first job makes her cache, data and config directories (prolog).
    assert srun_as(HOSTILE[0], "true").rc == 0


def srun_as(user, command, *flags):
    return node(CONTROLLER).run(
        f"cd /tmp && runuser -u {user} -- srun -w {NODE} {' '.join(flags)} {command}")


def as_mallory(script):
    return node(NODE).check_output(f"runuser -u {HOSTILE[0]} -- sh -ec {shlex.quote(script)}")


def node_state():
    return node(CONTROLLER).check_output(f"sinfo -h -n {NODE} -o %T").strip()


@contextlib.contextmanager
def node_kept_up():
    """Assert the node is not drained afterwards; resume it if it was, for the tests after."""
    try:
        yield
    finally:
        state = node_state()
        if "drain" in state:
            node(CONTROLLER).run(f"scontrol update nodename={NODE} state=resume")
        assert "drain" not in state, f"{NODE} was drained: {state}"


def test_cache_prune_timer_does_not_follow_a_users_symlinks():
    host = node(NODE)
    cache = f"/var/lib/berth/cache/{HOSTILE[1]}"
    host.check_output("rm -rf /root/prune-victim /etc/berth-planted && "
                      "install -d -m 0700 /root/prune-victim && "
                      "touch -d '60 days ago' /root/prune-victim/keep /root/prune-victim/" + LAYER)
    assert host.file(cache).user == HOSTILE[0]
    # images and blobs/sha256 point at root's directory; an old layer of her
    # own has a lock that points at a file root would create.
    as_mallory(f"cd {cache} && rm -rf images blobs locks && mkdir -p blobs locks mine && "
               "ln -s /root/prune-victim images && ln -s /root/prune-victim blobs/sha256 && "
               f"ln -s /etc/berth-planted locks/sha256-{LAYER}")
    try:
        host.run("systemctl start berth-cache-prune.service")
        assert host.file("/root/prune-victim/keep").exists
        assert host.file(f"/root/prune-victim/{LAYER}").exists
        assert not host.file("/etc/berth-planted").exists
    finally:
        host.run(f"rm -rf /root/prune-victim /etc/berth-planted {cache}/images {cache}/blobs "
                 f"{cache}/locks {cache}/mine")


def test_cache_prune_timer_still_prunes_a_users_old_layers_as_that_user():
    host = node(NODE)
    cache = f"/var/lib/berth/cache/{HOSTILE[1]}"
    as_mallory(f"mkdir -p {cache}/blobs/sha256 && "
               f"touch -d '60 days ago' {cache}/blobs/sha256/{LAYER} && touch {cache}/blobs/sha256/{'cd' * 32}")
    result = host.run("systemctl start berth-cache-prune.service")
    assert result.rc == 0, host.run("journalctl -u berth-cache-prune -n 20 --no-pager").stdout
    assert not host.file(f"{cache}/blobs/sha256/{LAYER}").exists
    assert host.file(f"{cache}/blobs/sha256/{'cd' * 32}").exists
    # nothing in her cache became root's
    assert host.run(f"find {cache} -not -user {HOSTILE[0]}").stdout.strip() == ""


def test_prolog_does_not_plant_a_config_in_another_users_home():
    host = node(NODE)
    victim_config = f"/home/{VICTIM[0]}/.config"
    host.check_output(f"rm -rf {victim_config} && install -d -o {VICTIM[0]} -g {VICTIM[0]} "
                      f"-m 0755 {victim_config}")
    as_mallory(f"rm -rf /home/mallory/.config && ln -s {victim_config} /home/mallory/.config")
    try:
        with node_kept_up():
            job = srun_as(HOSTILE[0], "true")
        assert host.run(f"ls -A {victim_config}").stdout.strip() == ""
        assert host.file(victim_config).user == VICTIM[0]
        assert job.rc == 0, job.stderr
    finally:
        as_mallory("rm -f /home/mallory/.config")


@pytest.mark.parametrize("planted", [
    "ln -s /nonexistent/enroot /home/mallory/.config/enroot",   # dangling
    "touch /home/mallory/.config/enroot",                       # a regular file
    "ln -s /home/victor /home/mallory/.config/enroot",          # someone else's directory
])
def test_a_broken_config_dir_in_the_users_home_does_not_drain_the_node(planted):
    as_mallory(f"rm -rf /home/mallory/.config && mkdir /home/mallory/.config && {planted}")
    try:
        with node_kept_up():
            job = srun_as(HOSTILE[0], "true")
        assert job.rc == 0, job.stderr
    finally:
        as_mallory("rm -rf /home/mallory/.config")
