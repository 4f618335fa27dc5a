"""An EDF's `containerfile` through `srun --environment` on the deployed
cluster: built once, at submission on the login node, on top of the bed's
image, and run on both compute nodes, which read it from the directory the
site names on the shared filesystem (BERTH_EDF_BUILD_PATH; /shared is every
node's). A second user's EDF of the same Containerfile and context builds
her own: nothing of the first user's build is hers.

The Containerfile's RUN step writes a random token: the two tasks of a job
print the same one when the image was built once (each node's own build
would give each its own), a second job the same again (the build reused),
another user's job another. The scenario's enroot.conf names no such
directory; this module sets one with the runtime's layer of site.yml (the
role's container_runtime_enroot_conf) and takes it away again."""

import json
import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, RUNTIME_PLAY, inventory_copy, node, per_rank, play

BUILDS = "/shared/edf-builds"  # the site's: root's, sticky, as /tmp
UIDS = {"alice": 2001, "bob": 2004}
IMAGE = "/opt/berth-images/mpi-test.sqsh"
# the scenario's own keys (inventories/local), and the build directory
SITE_KEYS = {"ENROOT_ALLOW_HTTP": "yes",
             "BERTH_MPI_LIBRARY": "/usr/lib/x86_64-linux-gnu/libmpich.so.12"}
WITH_BUILDS = {"container_runtime_enroot_conf": {
    **SITE_KEYS, "BERTH_EDF_BUILD_PATH": f"{BUILDS}/$(id -u)"}}
CONTAINERFILE = """\
FROM ignored-for-the-edfs-image
COPY stamp.txt /opt/edf-build/stamp.txt
RUN cat /proc/sys/kernel/random/uuid > /opt/edf-build/token
"""
EDF = f'image = "{IMAGE}"\ncontainerfile = "./Containerfile"\n'
SHOW = "sh -c 'cat /opt/edf-build/stamp.txt /opt/edf-build/token; grep ^VARIANT_ID= /etc/os-release'"


def _context(user):
    """The EDF and its build context in `user`'s ~/.edf/devtools/."""
    where = f"/home/{user}/.edf/devtools"
    node(CONTROLLER).check_output(
        f"install -d -o {user} /home/{user}/.edf {where} && "
        f"printf '%s' {shlex.quote(EDF)} > {where}/edfbuild.toml && "
        f"printf '%s' {shlex.quote(CONTAINERFILE)} > {where}/Containerfile && "
        f"echo the-stamp > {where}/stamp.txt && chown -R {user} {where}")
    return f"{where}/edfbuild.toml"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    inventory = inventory_copy(tmp_path_factory.mktemp("edfbuild"))
    node(CONTROLLER).check_output(f"rm -rf {BUILDS} && install -d -m 1777 {BUILDS}")
    rc, output, _ = play(inventory, "-e", json.dumps(WITH_BUILDS), playbook=RUNTIME_PLAY)
    assert rc == 0, output[-3000:]
    for user in UIDS:  # what the login node's PAM hook does at an interactive login
        node(CONTROLLER).check_output(f"berth setup-user {user}")
        for name in [CONTROLLER, *COMPUTE]:
            node(name).check_output(f"runuser -u {user} -- install -d -m 0700 {user_tmp(user)}")
    yield {user: _context(user) for user in UIDS}
    rc, output, _ = play(inventory, playbook=RUNTIME_PLAY)
    assert rc == 0, output[-3000:]
    node(CONTROLLER).run(f"rm -rf {BUILDS} " + " ".join(
        f"/home/{user}/.edf/devtools" for user in UIDS))
    for name in [CONTROLLER, *COMPUTE]:
        node(name).run("rm -rf " + " ".join(user_tmp(user) for user in UIDS))
    for name in [CONTROLLER, *COMPUTE]:
        assert "BERTH_EDF_BUILD_PATH" not in node(name).file("/etc/enroot/enroot.conf").content_string


def user_tmp(user):
    """`user`'s TMPDIR: the nodes' /tmp is noexec, where a build's RUN step
    cannot run the image's programs (a build works in ENROOT_TEMP_PATH)."""
    return f"/home/{user}/.cache/tmp"


def srun(user, edf):
    return node(CONTROLLER).run(
        f"cd /tmp && runuser -u {user} -- env TMPDIR={user_tmp(user)} "
        f"srun -N2 --ntasks-per-node=1 -l --environment={edf} {SHOW}")


def tokens(job):
    """The one token both tasks printed, with the checks of each task's lines."""
    assert job.rc == 0, job.stdout + job.stderr
    lines = per_rank(job)
    assert sorted(lines) == [0, 1], job.stdout
    assert lines[0] == lines[1], job.stdout  # one image for both nodes: one build
    stamp, token, variant = lines[0]
    assert (stamp, variant) == ("the-stamp", "VARIANT_ID=berth-mpi-test"), job.stdout
    return token


def built_files(user):
    listing = node(COMPUTE[0]).run(f"ls {BUILDS}/{UIDS[user]}")
    return sorted(listing.stdout.split())


def test_the_image_is_built_once_at_submission_and_runs_on_both_nodes(builds):
    token = tokens(srun("alice", builds["alice"]))
    files = built_files("alice")
    assert len(files) == 1 and files[0].endswith(".sqsh"), files
    # built on the login node alone: no compute node ran a step of it
    for name in COMPUTE:
        assert not node(name).file(f"/var/lib/berth/cache/{UIDS['alice']}/images/{files[0]}").exists
    assert tokens(srun("alice", builds["alice"])) == token  # the build reused
    assert built_files("alice") == files


def test_a_second_users_edf_of_the_same_context_reuses_nothing_of_the_first(builds):
    alices = tokens(srun("alice", builds["alice"]))
    bobs = tokens(srun("bob", builds["bob"]))
    assert bobs != alices  # bob's RUN step ran: alice's step cache is not his
    assert len(built_files("bob")) == 1
    # alice's builds are hers alone to read, on the shared filesystem too
    top = node(COMPUTE[1]).file(f"{BUILDS}/{UIDS['alice']}")
    assert (top.user, top.mode) == ("alice", 0o700)
    peek = node(CONTROLLER).run(f"runuser -u bob -- ls {BUILDS}/{UIDS['alice']}")
    assert peek.rc != 0 and "Permission denied" in peek.stderr
