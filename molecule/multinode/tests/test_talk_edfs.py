"""The CSCS talk's EDFs ("Containers-First User Environments on HPE Cray
EX") through `srun --environment` on the deployed cluster, as written there
but for their images' and mounts' paths: the first one (devtools: two
parents, an image built from a Containerfile on top of `image`, three
mounts, a writable root), FourCastNet's (an image file and five mounts
under ${SCRATCH}, one source holding a space) and the use case built on the
site's `cscs-mlp` base. All ask for the CXI and NCCL-plugin hooks in the
talk's spelling; these nodes have neither Slingshot nor InfiniBand, so the
hooks step aside and the jobs run. The devtools EDF's image is built at
submission and reaches the nodes through BERTH_EDF_BUILD_PATH, which
test_shared_edf_builds's fixture sets for this module too.

${SCRATCH} is a directory of each node's own, with that node's name in its
files, so each task's lines say whose mounts it got."""

import shlex

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, PROJECT, node, per_rank
from test_shared_edf_builds import builds, user_tmp  # noqa: F401 (a fixture: BERTH_EDF_BUILD_PATH set)

SCRATCH = "/var/tmp/talk-scratch"
FCN = f"{SCRATCH}/fcn-collaboration"
# the talk's, as the runtime's EDF tests read them
TALK_EDFS = PROJECT / "runtime/tests/talk_edfs"
FOURCASTNET = (TALK_EDFS / "fourcastnet.toml").read_text()
CSCS_MLP = (TALK_EDFS / "cscs-mlp.toml").read_text()
USE_CASE = """\
base_environment = "cscs-mlp"
image = "/opt/berth-images/mpi-test.sqsh"
"""
# the talk's first listing; its mounts' sources are ${SCRATCH}'s
DEVTOOLS = """\
base_environment = ["parent_env0", "research_group_env"]
image = "/opt/berth-images/mpi-test.sqsh"
containerfile = "./Containerfile.devtools"
workdir = "/workdir"
entrypoint = false
writable = true
mounts = ["${SCRATCH}/experiment:/workdir", "${SCRATCH}/configs:/workdir/configs", "${SCRATCH}/data:/workdir/data"]

[env]
MELLANOX_VISIBLE_DEVICES = "none"
CONFDIR = "/workdir/configs"
UNSET_BEFORE_RUNNING = ""

[annotations]
com.hooks.cxi.enable = true
com.hooks.ofi_nccl.version = "cuda12"
"""
# its parents, which the talk does not show
PARENTS = {"parent_env0": '[env]\nPARENT = "0"\n',
           "research_group_env": '[env]\nGROUP = "research"\n'}
CONTAINERFILE = """\
FROM the-edfs-image
RUN mkdir /opt/devtools && cat /proc/sys/kernel/random/uuid > /opt/devtools/token
"""
EDFS = {"fourcastnet": FOURCASTNET, "cscs-mlp": CSCS_MLP, "talk-use-case": USE_CASE,
        "talk-devtools": DEVTOOLS, **PARENTS}


def _scratch(name):
    """Node `name`'s ${SCRATCH}: the FourCastNet image and its five mount sources."""
    sources = " ".join(shlex.quote(f"{FCN}/{d}") for d in
                       ("FourCastNet", "era5", "stats", "model weights", "out"))
    node(name).run(
        f"install -d -o alice {SCRATCH} {FCN} {sources} && "
        f"cp /opt/berth-images/mpi-test.sqsh '{FCN}/ml+fourcastnet+22.12.sqsh' && "
        f"echo weights-of-{name} > '{FCN}/model weights/w.txt' && "
        f"echo scratch-of-{name} > {SCRATCH}/here && "
        f"install -d -o alice {SCRATCH}/experiment/configs {SCRATCH}/experiment/data "
        f"{SCRATCH}/configs {SCRATCH}/data && "
        f"echo config-of-{name} > {SCRATCH}/configs/c.txt && "
        f"echo data-of-{name} > {SCRATCH}/data/d.txt && "
        f"install -o alice -m 0600 /dev/null /home/alice/.bash_history")


@pytest.fixture(scope="module")
def talk():
    for name in NODES:
        _scratch(name)
    for edf, text in EDFS.items():
        node(CONTROLLER).run(
            f"install -d -o alice /home/alice/.edf && printf '%s' {shlex.quote(text)} "
            f"> /home/alice/.edf/{edf}.toml && chown alice /home/alice/.edf/{edf}.toml")
    node(CONTROLLER).run(
        f"printf '%s' {shlex.quote(CONTAINERFILE)} > /home/alice/.edf/Containerfile.devtools && "
        "chown alice /home/alice/.edf/Containerfile.devtools")
    yield
    node(CONTROLLER).run("rm -f /home/alice/.edf/Containerfile.devtools " + " ".join(
        f"/home/alice/.edf/{edf}.toml" for edf in EDFS))
    for name in NODES:
        node(name).run(f"rm -rf {SCRATCH}")


def srun(args, *environ):
    return node(CONTROLLER).run(
        f"cd /home/alice && runuser -u alice -- env SCRATCH={SCRATCH} {' '.join(environ)} "
        f"srun {args}")


@pytest.mark.usefixtures("builds")
def test_the_devtools_edf_is_built_once_and_runs_on_both_nodes_as_written(talk):
    job = srun("-N2 --ntasks-per-node=1 -l --environment=talk-devtools sh -c "
               "'pwd; cat /opt/devtools/token configs/c.txt data/d.txt; "
               "echo $CONFDIR $PARENT $GROUP $MELLANOX_VISIBLE_DEVICES; "
               "touch /written && echo writable; grep ^VARIANT_ID= /etc/os-release'",
               f"TMPDIR={user_tmp('alice')}")
    assert job.rc == 0, job.stdout + job.stderr
    lines = per_rank(job)
    token = lines[0][1]
    assert lines == {
        rank: ["/workdir", token, f"config-of-{name}", f"data-of-{name}",
               "/workdir/configs 0 research none", "writable", "VARIANT_ID=berth-mpi-test"]
        for rank, name in enumerate(COMPUTE)}, job.stdout  # one build: one token


def test_the_fourcastnet_edf_runs_on_both_nodes_as_written(talk):
    job = srun("-N2 --ntasks-per-node=1 -l --environment=fourcastnet sh -c "
               "'cat /data/weights/w.txt; ls -d /workspace/FourCastNet /data/era5 /data/stats "
               "/workspace/out; grep ^VARIANT_ID= /etc/os-release'")
    assert job.rc == 0, job.stdout + job.stderr
    assert per_rank(job) == {
        rank: [f"weights-of-{name}", "/data/era5", "/data/stats", "/workspace/FourCastNet",
               "/workspace/out", "VARIANT_ID=berth-mpi-test"]
        for rank, name in enumerate(COMPUTE)}, job.stdout


def test_the_use_case_on_the_sites_base_runs_on_both_nodes(talk):
    job = srun("-N2 --ntasks-per-node=1 -l --environment=talk-use-case sh -c "
               f"'echo $HISTFILE; test -f /.bash_history && echo history; cat {SCRATCH}/here'")
    assert job.rc == 0, job.stdout + job.stderr
    assert per_rank(job) == {
        rank: ["/.bash_history", "history", f"scratch-of-{name}"]
        for rank, name in enumerate(COMPUTE)}, job.stdout
