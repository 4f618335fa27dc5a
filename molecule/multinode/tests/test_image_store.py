"""The shared image store on the cluster: one registry pull per image per
cluster, for every node and user; private images stay with their user.

/shared is one host directory bind-mounted into every node (molecule.yml),
standing in for the parallel filesystem. The scenario's inventory has no
store (each node imports for itself, the default); this module turns it on
and off again with runs of the runtime's layer of site.yml (the store is that
role's alone)."""

import collections
import hashlib
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from conftest import COMPUTE, CONTROLLER, NODES, RUNTIME_PLAY, inventory_copy, node, play

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import realistic_image

STORE = "/shared/berth/images"
PUBLIC_REPO = "berth/store-test"
PUBLIC = f"{CONTROLLER}:5000#{PUBLIC_REPO}:1"
PRIVATE = f"{CONTROLLER}:5001#private/mpi-test:1"
SIF_REPO = "berth/sif-test"


def blob_get(repo):
    return re.compile(rf'"GET /v2/{repo}/blobs/(sha256:[0-9a-f]{{64}}) HTTP/[0-9.]+" 200 ')


BLOB_GET = blob_get(PUBLIC_REPO)
UIDS = {"alice": 2001, "bob": 2004}
PRESTAGED = f"{CONTROLLER}:5000#berth/prestage:1"
# store on, one image pre-staged: the fixture's site.yml arguments
STAGE = ["-e", f"container_runtime_image_store={STORE}",
         "-e", '{"container_runtime_prestage_images": ["%s"]}' % PRESTAGED]
FIRST_PLAY = {}  # what the fixture's run printed, and the pre-staged tag's digest then
# A tag of this run's own where a test needs an image no user has cached yet:
# the verify step may run again on the same cluster (test.sh --fast)
RUN = str(int(time.time()))


def srun(args, user):
    return node(CONTROLLER).run(f"cd /tmp && runuser -u {user} -- srun {args}")


def store_images():
    listing = node(COMPUTE[0]).run(f"ls {STORE}/images")
    return sorted(name for name in listing.stdout.split() if name.endswith(".sqsh"))


def own_images(name, user):
    listing = node(name).run(f"ls /var/lib/berth/cache/{UIDS[user]}/images")
    return sorted(listing.stdout.split())


def now():
    mark = int(time.time())
    time.sleep(1.1)
    return mark


def blob_gets(mark, pattern=BLOB_GET):
    log = node(CONTROLLER).check_output(
        f"journalctl -u docker-registry --since=@{mark} -o cat --no-pager")
    return collections.Counter(pattern.findall(log))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    inventory = inventory_copy(tmp_path_factory.mktemp("store"))
    node(CONTROLLER).check_output("rm -rf /shared/berth")  # new to the cluster, each run
    # an image no test imported before, pushed under its own name
    node(CONTROLLER).check_output(
        "skopeo copy -q --dest-tls-verify=false docker-archive:/opt/berth-images/mpi-test.tar "
        f"docker://localhost:5000/{PUBLIC_REPO}:1")
    FIRST_PLAY["digest"] = push("berth/prestage", "v2s2")
    rc, output, _ = play(inventory, *STAGE, playbook=RUNTIME_PLAY)
    assert rc == 0, output[-3000:]
    FIRST_PLAY["output"] = output
    yield STORE
    rc, output, _ = play(inventory, playbook=RUNTIME_PLAY)
    assert rc == 0, output[-3000:]
    for name in [CONTROLLER, *COMPUTE]:
        assert not node(name).file("/etc/systemd/system/berth-store.socket").exists
        assert not node(name).file("/etc/systemd/system/berth-store-prune.timer").exists
        assert "BERTH_IMAGE_STORE" not in node(name).file("/etc/enroot/enroot.conf").content_string


def test_the_store_is_set_up_on_every_node(store):
    for name in NODES:
        host = node(name)
        assert f"BERTH_IMAGE_STORE {store}\n" in host.file("/etc/enroot/enroot.conf").content_string
        assert host.check_output("systemctl is-active berth-store.socket") == "active"
        socket = host.file("/run/berth-store.sock")
        assert socket.is_socket and socket.mode == 0o666
        assert host.check_output("id -u berth-store") == "970"
        # every import of the node in one slice with the role's caps, behind the jobs
        assert set(host.check_output("systemctl show -p CPUQuotaPerSecUSec -p TasksMax -p "
                                     "IOWeight berth-store.slice").split()) == \
            {"CPUQuotaPerSecUSec=1s", "TasksMax=256", "IOWeight=10"}
        assert set(host.check_output("systemctl show -p Slice -p Nice -p IOSchedulingPriority "
                                     "berth-store@probe.service").split()) == \
            {"Slice=berth-store.slice", "Nice=10", "IOSchedulingPriority=7"}
    top = node(COMPUTE[0]).file(store)
    assert (top.user, top.mode) == ("berth-store", 0o755)


def test_a_moved_tag_sharing_the_lower_layers_is_stored_as_its_new_layer_and_runs(store):
    # (early in the module: the tags the later tests import share these
    # lower layers, and each builds on the last, up to the store's cap)
    tag = f"layered-{RUN}"
    image = f"{CONTROLLER}:5000#{PUBLIC_REPO}:{tag}"
    first = push_layer(tag, "one")
    job = srun(f"-w {COMPUTE[0]} --container-image={image} cat /opt/berth-tag", "alice")
    assert job.rc == 0 and job.stdout == "one\n", job.stderr
    moved = push_layer(tag, "two")
    time.sleep(1.1)  # the push's own GET of the config falls in an earlier second
    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={image} cat /opt/berth-tag",
               "bob")
    assert job.rc == 0 and job.stdout == "two\ntwo\n", job.stderr
    fetched = blob_gets(mark)
    assert len(fetched) == 2 and set(fetched.values()) == {1}, fetched  # the layer, the config
    # made on the first tag's entry: a copy of it and a top part of the new layer
    assert top_parts(stored_entry(f"{PUBLIC_REPO}@{moved}")) == \
        top_parts(stored_entry(f"{PUBLIC_REPO}@{first}")) + 1


def test_no_layer_chooses_the_digest_the_store_and_the_plugin_report(store):
    # an image whose lower layer poses as a part claiming another digest
    forged = "sha256:" + "0" * 64
    tag = f"forged-{RUN}"
    digest = push_layer(tag, "forged", forged)
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={CONTROLLER}:5000#{PUBLIC_REPO}:{tag}"
               " cat /opt/berth-tag /.berth-top.9/seen", "alice")
    assert job.rc == 0 and sorted(job.stdout.split()) == ["forged"] * 2 + ["seen"] * 2, \
        job.stderr
    sources = listed_sources()
    assert f"{PUBLIC_REPO}@{digest}" in sources and "nvcr.io" not in sources, sources
    # stored whole: its /.berth-top.9 is a directory of the image's, no part
    entry = stored_entry(f"{PUBLIC_REPO}@{digest}")
    listing = node(COMPUTE[0]).check_output(f"unsquashfs -l -max-depth 1 {entry}").split()
    assert [name for name in listing if ".berth-top." in name] == \
        ["squashfs-root/.berth-top.9"], listing
    for name in COMPUTE:  # the step's digest, as the plugin logs it
        log = node(name).check_output("tail -n 80 /var/log/slurm/slurmd.log")
        assert f"digest {digest}" in log and forged not in log, log


def stored_entry(source):
    [entry] = [line.split()[-1] for line in listed_sources().splitlines() if source in line]
    return entry


def top_parts(entry):
    """How many parts the store's entry holds (the runtime's image/parts.py)."""
    listing = node(COMPUTE[0]).check_output(f"unsquashfs -l -max-depth 1 {entry}").split()
    return len([name for name in listing if name.startswith("squashfs-root/.berth-top.")])


def test_a_public_image_is_pulled_once_for_both_nodes_and_both_users(store):
    before = {(name, user): own_images(name, user) for name in COMPUTE for user in UIDS}
    stored = store_images()
    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={PUBLIC} cat /etc/os-release", "alice")
    assert job.rc == 0, job.stderr
    assert job.stdout.count("ID=") >= 2
    fetched = blob_gets(mark)
    assert fetched and set(fetched.values()) == {1}, fetched  # each blob once, for two nodes
    [entry] = set(store_images()) - set(stored)
    image = node(COMPUTE[0]).file(f"{store}/images/{entry}")
    assert (image.user, image.mode) == ("berth-store", 0o644)

    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={PUBLIC} true", "bob")
    assert job.rc == 0, job.stderr
    assert blob_gets(mark) == {}  # nothing fetched again for the second user
    assert store_images() == sorted([*stored, entry])
    # neither user's own cache got a copy: both nodes ran the store's entry
    assert {(name, user): own_images(name, user) for name in COMPUTE for user in UIDS} == before


# `apptainer push FILE oras://localhost:5000/REPO:TAG`, as the registry gets it:
# an empty JSON config of the SIF config type, the SIF file the one layer
# A registry client's blob upload, for the Python scripts below: `repo`, `top`.
PUT_BLOB = r"""
import gzip, hashlib, io, json, sys, tarfile, urllib.parse, urllib.request
top = "http://localhost:5000"
def put_blob(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = urllib.request.urlopen(urllib.request.Request(
        f"{top}/v2/{repo}/blobs/uploads/", method="POST"))
    where = urllib.parse.urljoin(top, started.headers["Location"])
    where += ("&" if "?" in where else "?") + "digest=" + digest
    urllib.request.urlopen(urllib.request.Request(
        where, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"}))
    return {"digest": digest, "size": len(data)}
"""

ORAS_PUSH = r"""
import sys
path, repo, tag = sys.argv[1:]
""" + PUT_BLOB + r"""
sif = open(path, "rb").read()
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.sylabs.sif.config.v1+json", **put_blob(b"{}")},
            "layers": [{"mediaType": "application/vnd.sylabs.sif.layer.v1.sif", **put_blob(sif)}]}
body = json.dumps(manifest).encode()
urllib.request.urlopen(urllib.request.Request(
    f"{top}/v2/{repo}/manifests/{tag}", data=body, method="PUT",
    headers={"Content-Type": manifest["mediaType"]}))
print("sha256:" + hashlib.sha256(body).hexdigest())
"""


def test_a_production_shaped_image_is_stored_once_and_runs_as_its_layers_make_it(store):
    """bench/realistic_image.py's image, small (40 layers; whiteouts, an
    opaque directory, replaced files, hard links and symlinks): the store
    packs it once for both nodes, each node's tasks see the tree its layers
    make, path by path, and the second user's step fetches nothing."""
    shape = realistic_image.CLUSTER_TEST_SHAPE
    # (with a shell on top: scripts/test-image.sh, realistic_image.with_shell)
    layout = f"/opt/berth-test-images/realistic/{realistic_image.shape_name(**shape)}/oci-shell"
    repo = "berth/realistic"
    node(CONTROLLER).check_output(
        f"skopeo copy -q --dest-tls-verify=false oci:{layout}:{realistic_image.TAG} "
        f"docker://localhost:5000/{repo}:{RUN}")
    final = realistic_image.final_paths(realistic_image.plan(**shape))
    tops = sorted({path.split("/")[0] for path in final})
    expected = hashlib.sha256(b"".join(path.encode() + b"\n" for path in
                                       sorted(final, key=str.encode))).hexdigest()
    listing = shlex.quote(f"cd / && find {' '.join(tops)} | LC_ALL=C sort | sha256sum")
    image = f"{CONTROLLER}:5000#{repo}:{RUN}"
    stored = store_images()
    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={image} sh -c {listing}", "alice")
    assert job.rc == 0, job.stderr
    assert job.stdout.split() == [expected, "-"] * 2
    fetched = blob_gets(mark, blob_get(repo))
    assert len(fetched) > 30 and set(fetched.values()) == {1}, fetched
    assert len(set(store_images()) - set(stored)) == 1

    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={image} sh -c true", "bob")
    assert job.rc == 0, job.stderr
    assert blob_gets(mark, blob_get(repo)) == {}


def test_a_sif_image_from_the_registry_is_pulled_once_and_runs_mpi_on_both_nodes(store):
    digest = node(CONTROLLER).check_output(f"python3 -c {shlex.quote(ORAS_PUSH)} "
                                           f"/opt/berth-images/mpi-test.sif {SIF_REPO} {RUN}")
    image = f"oras://{CONTROLLER}:5000/{SIF_REPO}:{RUN}"
    stored = store_images()
    mark = now()
    # allreduce-openmpi by name: on PATH through the SIF's environment script
    job = srun(f"-N2 -n4 -w {','.join(COMPUTE)} --mpi=pmix --container-image={image} "
               "allreduce-openmpi", "alice")
    assert job.rc == 0 and "allreduce sum 10" in job.stdout, job.stdout + job.stderr
    fetched = blob_gets(mark, blob_get(SIF_REPO))
    assert len(fetched) == 1 and set(fetched.values()) == {1}, fetched  # the SIF file, once
    [entry] = set(store_images()) - set(stored)
    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={image} "
               "sh -c 'echo $MPI_TEST_IMAGE'", "bob")
    assert job.stdout.split() == ["sif", "sif"], job.stdout + job.stderr
    assert blob_gets(mark, blob_get(SIF_REPO)) == {}  # nothing fetched again for bob
    # the tag resolved at submission: the nodes imported it pinned
    listed = listed_sources()
    assert f"oras://{CONTROLLER}:5000/{SIF_REPO}@{digest}" in listed and entry in listed


def test_a_user_can_neither_write_into_the_store_nor_replace_an_entry(store):
    before = store_images()
    assert before, "the store's entries"
    entry = before[0]
    host = node(COMPUTE[0])
    path = f"{store}/images/{entry}"
    digest = host.check_output(f"sha256sum {path}")
    for attempt in (f"touch {store}/images/planted.sqsh",
                    f"cp /bin/true {path}",
                    f"mv {path} {path}.old",
                    f"rm -f {path}",
                    f"ln -sf /tmp/x {store}/uris/planted",
                    f"chmod 0666 {path}"):
        result = host.run(f"runuser -u alice -- sh -c '{attempt}'")
        assert result.rc != 0, attempt
    assert host.check_output(f"sha256sum {path}") == digest
    assert store_images() == before
    # nor hold an import's lock (and with it that image's imports and the prune)
    locks = host.file(f"{store}/locks")
    assert (locks.user, locks.mode) == ("berth-store", 0o700)
    held = host.run(f"runuser -u alice -- flock -n -s {store}/locks/image-{entry[:-5]} true")
    assert held.rc != 0 and "Permission denied" in held.stderr, held.stderr


HOLD_FOUR = ("import socket, time\n"
             "held = [socket.socket(socket.AF_UNIX) for _ in range(4)]\n"
             "[s.connect('/run/berth-store.sock') for s in held]\n"
             "time.sleep(60)  # berth-store-slot-holder\n")


def test_one_user_holds_at_most_four_of_a_nodes_store_connections(store):
    """Idle connections took every import slot of a node for everyone."""
    host = node(COMPUTE[0])
    host.check_output(f"runuser -u alice -- python3 -c {shlex.quote(HOLD_FOUR)} "
                      ">/dev/null 2>&1 &")
    try:
        time.sleep(2)
        ask = f"berth import --cache-only docker://{PUBLIC}"
        mine = host.run(f"cd /tmp && runuser -u alice -- {ask}")
        assert mine.rc == 0, mine.stderr
        assert "has 4 requests open on this node already; importing into your own cache" \
            in mine.stderr, mine.stderr
        theirs = host.run(f"cd /tmp && runuser -u bob -- {ask}")
        assert theirs.rc == 0 and theirs.stdout.startswith(f"{store}/images/"), theirs.stderr
    finally:
        host.run("pkill -u alice -f berth-store-slot-holder")


def test_one_users_hourly_share_of_the_store_holds_on_every_node(store):
    """Any user could make the store import image after image for everyone
    to hold. Alice's imports of the last hour, written down on one node, are
    counted on the other; past her share she imports for herself, and bob
    is served from the store."""
    record = f"{store}/users/{UIDS['alice']}"
    ctl = node(CONTROLLER)
    ctl.check_output("skopeo copy -q --dest-tls-verify=false docker-archive:/opt/berth-images/"
                     f"mpi-test.tar docker://localhost:5000/berth/store-share:{RUN}")
    ask = f"berth import --cache-only docker://{CONTROLLER}:5000#berth/store-share:{RUN}"
    writer, asked = node(COMPUTE[1]), node(COMPUTE[0])
    for user in ("alice", "bob"):  # their caches on the node: a job's prolog makes them
        assert srun(f"-w {COMPUTE[0]} true", user).rc == 0
    # (the store's first request makes users/; this test may be the first)
    writer.check_output(f"runuser -u berth-store -- sh -c 'mkdir -p -m 0700 {store}/users && "
                        f"now=$(date +%s); for i in $(seq 20); do echo \"$now 1 1000\"; "
                        f"done > {record}'")
    try:
        mine = asked.run(f"cd /tmp && runuser -u alice -- {ask}")
        assert mine.rc == 0, mine.stderr
        assert (f"uid {UIDS['alice']} used its hourly share of the store's imports (20 images "
                "or 100.0G): 20, 19.5K, in the last hour; importing into your own cache") \
            in mine.stderr, mine.stderr
        assert mine.stdout.startswith(f"/var/lib/berth/cache/{UIDS['alice']}/images/")
        theirs = asked.run(f"cd /tmp && runuser -u bob -- {ask}")
        assert theirs.rc == 0 and theirs.stdout.startswith(f"{store}/images/"), theirs.stderr
    finally:
        writer.check_output(f"rm -f {record}")


def test_a_private_image_stays_in_its_users_cache(store):
    before = store_images()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={PRIVATE} true", "alice")
    assert job.rc == 0, job.stderr
    assert store_images() == before  # the store's account has no credentials for it
    for name in COMPUTE:
        assert own_images(name, "alice"), name
        peek = node(name).run(f"runuser -u bob -- ls /var/lib/berth/cache/{UIDS['alice']}/images")
        assert peek.rc != 0, "bob reads alice's cache"
    job = srun(f"-N1 -w {COMPUTE[0]} --container-image={PRIVATE} true", "bob")
    assert job.rc == 0, job.stderr  # with his own credentials
    assert own_images(COMPUTE[0], "bob")
    assert store_images() == before


def test_an_import_killed_half_way_leaves_no_entry_and_the_next_imports_cleanly(store):
    ctl = node(CONTROLLER)
    ctl.check_output("skopeo copy -q --dest-tls-verify=false docker-archive:/opt/berth-images/"
                     f"mpi-test.tar docker://localhost:5000/berth/store-kill:{RUN}")
    image = f"{CONTROLLER}:5000#berth/store-kill:{RUN}"
    before = store_images()
    ctl.check_output(f"cd /tmp && runuser -u alice -- sh -c 'srun -w {COMPUTE[0]} "
                     f"--container-image={image} true >/tmp/killed-step.log 2>&1 &'")
    importing = node(COMPUTE[0])
    killed = False
    for _ in range(300):  # the store's import runs for seconds: catch it at work
        units = importing.run("systemctl list-units --no-legend --state=active 'berth-store@*'")
        if units.stdout.strip():
            importing.check_output("systemctl kill --signal=KILL 'berth-store@*'")
            killed = True
            break
        time.sleep(0.1)
    assert killed, "no import of the store seen at work"
    for _ in range(120):  # the step goes on from alice's own cache
        if ctl.run("pgrep -u alice -x srun").rc != 0:
            break
        time.sleep(1)
    assert store_images() == before  # nothing half-written became an entry

    job = srun(f"-w {COMPUTE[1]} --container-image={image} true", "bob")
    assert job.rc == 0, job.stderr
    after = store_images()
    assert len(after) == len(before) + 1, after
    [new] = set(after) - set(before)
    entry = node(COMPUTE[1]).file(f"{store}/images/{new}")
    assert (entry.user, entry.mode) == ("berth-store", 0o644)
    # what the killed import had written is gone with the next import of the image
    names = node(COMPUTE[1]).check_output(f"ls -A {store}/images").split()
    assert [n for n in names if not re.fullmatch(r"[0-9a-f]{64}\.sqsh", n)] == []


def push(repo, manifest_format):
    """The test image under REPO:1 in the cluster's registry, its manifest as
    Docker v2s2 or OCI: the same layers, another manifest digest, so a second
    push moves the tag. Returns the tag's digest now."""
    ctl = node(CONTROLLER)
    ctl.check_output(f"skopeo copy -q --format {manifest_format} --dest-tls-verify=false "
                     f"docker-archive:/opt/berth-images/mpi-test.tar docker://localhost:5000/{repo}:1")
    return ctl.check_output(f"skopeo inspect --tls-verify=false --format '{{{{.Digest}}}}' "
                            f"docker://localhost:5000/{repo}:1")


def listed_sources():
    """The URIs the store's entries were imported from, as `berth store list` prints them."""
    return node(COMPUTE[0]).check_output("berth store list")


def test_a_tag_moved_between_two_jobs_runs_the_new_image(store):
    first = push("berth/store-moved", "v2s2")
    image = f"{CONTROLLER}:5000#berth/store-moved:1"
    job = srun(f"-w {COMPUTE[0]} --container-image={image} true", "alice")
    assert job.rc == 0, job.stderr
    before = store_images()
    assert f"berth/store-moved@{first}" in listed_sources()

    moved = push("berth/store-moved", "oci")
    assert moved != first
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={image} true", "bob")
    assert job.rc == 0, job.stderr
    after = store_images()
    assert len(after) == len(before) + 1, after  # one new entry, for both nodes
    assert f"berth/store-moved@{moved}" in listed_sources()
    log = node(COMPUTE[1]).check_output("tail -n 50 /var/log/slurm/slurmd.log")
    assert f"digest {moved}" in log


# A new tag of the public image: its layers and one more, a gzip layer with
# the file /opt/berth-tag, pushed as a registry client would (Python's
# urllib on the controller; the lower layers' blobs are the repository's).
# With `forged` (a digest), a layer before that one poses as a part of
# Berth's: /.berth-top.9 with a marker (a link whose target holds a
# newline and a forged listing line) and an image.json of that digest.
LAYER_PUSH = r"""
import sys
repo, base, tag, text, forged = sys.argv[1:]
""" + PUT_BLOB + r"""
def get(path, accept=""):
    reply = urllib.request.urlopen(urllib.request.Request(
        f"{top}/v2/{repo}/{path}", headers={"Accept": accept}))
    return reply.read(), reply.headers["Content-Type"]
body, media = get(f"manifests/{base}", "application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json")
manifest = json.loads(body)
config = json.loads(get(f"blobs/{manifest['config']['digest']}")[0])
layer_type = ("application/vnd.docker.image.rootfs.diff.tar.gzip" if "docker" in media
              else "application/vnd.oci.image.layer.v1.tar+gzip")
def add_layer(dirs, files, links=()):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(raw.getvalue()).hexdigest())
    config.setdefault("history", []).append({"created_by": "a layer of berth's test"})
    manifest["layers"].append({"mediaType": layer_type,
                               **put_blob(gzip.compress(raw.getvalue(), mtime=0))})
if forged != "-":
    part = ".berth-top.9"
    record = json.dumps({"source": "docker://nvcr.io#nvidia/pytorch:24.01", "digest": forged})
    # its marker a link whose target forges the line `unsquashfs -lls` prints for Berth's
    target = f"x\ncrw-r--r-- root/root  0,  0 2023-11-14 22:13 squashfs-root/{part}/{part}"
    add_layer([part, f"{part}/etc", f"{part}/etc/berth"],
              {f"{part}/etc/berth/image.json": record.encode(), f"{part}/seen": b"seen\n"},
              links=[(f"{part}/{part}", target)])
add_layer(["opt"], {"opt/berth-tag": text.encode() + b"\n"})
manifest["config"].update(put_blob(json.dumps(config).encode()))
body = json.dumps(manifest).encode()
urllib.request.urlopen(urllib.request.Request(
    f"{top}/v2/{repo}/manifests/{tag}", data=body, method="PUT",
    headers={"Content-Type": media}))
print("sha256:" + hashlib.sha256(body).hexdigest())
"""


def push_layer(tag, text, forged="-"):
    """PUBLIC's image with one more layer (/opt/berth-tag holding `text`) as
    PUBLIC_REPO:TAG, and with `forged` a layer posing as a part below it
    (LAYER_PUSH); the tag's digest."""
    return node(CONTROLLER).check_output(
        f"python3 - {PUBLIC_REPO} 1 {tag} {text} {forged} <<'EOF'\n{LAYER_PUSH}EOF")


def prestage_task(output):
    """'changed' or 'ok' (or None): what the pre-staging task reported."""
    found = re.search(r"TASK \[container_runtime : Pull the pre-staged images[^\n]*\n"
                      r"(?:[^\n]*\n)*?(changed|ok): \[", output)
    return found and found.group(1)


def test_prestaged_images_are_pulled_once_and_again_only_when_their_tag_moves(
        store, tmp_path_factory):
    # the fixture's run, with the store new and the image in the list
    assert prestage_task(FIRST_PLAY["output"]) == "changed"
    assert f"berth/prestage@{FIRST_PLAY['digest']}" in listed_sources()

    # again: pulls nothing, changes nothing on any node
    inventory = inventory_copy(tmp_path_factory.mktemp("prestage"))
    rc, output, recap = play(inventory, *STAGE, playbook=RUNTIME_PLAY)
    assert rc == 0 and prestage_task(output) == "ok", output[-3000:]
    assert set(recap.values()) == {0}, recap

    # the tag moved: one node pulls for the store (the task runs once), so
    # these runs are limited to one node
    moved = push("berth/prestage", "oci")
    staged = store_images()
    one_node = ["--limit", COMPUTE[0]]
    rc, output, _ = play(inventory, "--check", *one_node, *STAGE, playbook=RUNTIME_PLAY)
    assert rc == 0, output[-3000:]
    assert prestage_task(output) == "changed"  # the check run tells the pull ...
    assert store_images() == staged  # ... and pulls nothing
    rc, output, _ = play(inventory, *one_node, *STAGE, playbook=RUNTIME_PLAY)
    assert rc == 0 and prestage_task(output) == "changed", output[-3000:]
    assert f"berth/prestage@{moved}" in listed_sources()

    # the job finds the moved tag's image in the store: no blob fetched, no new entry
    staged = store_images()
    mark = now()
    job = srun(f"-N2 -w {','.join(COMPUTE)} --container-image={PRESTAGED} true", "alice")
    assert job.rc == 0, job.stderr
    log = node(CONTROLLER).check_output(
        f"journalctl -u docker-registry --since=@{mark} -o cat --no-pager")
    assert "/blobs/" not in log, log[-2000:]
    assert store_images() == staged


def test_one_node_prunes_the_store_as_its_account_what_no_step_used_for_30_days(store):
    first, other = COMPUTE
    assert node(first).check_output("systemctl is-enabled berth-store-prune.timer") == "enabled"
    for name in (CONTROLLER, other):
        assert not node(name).file("/etc/systemd/system/berth-store-prune.timer").exists, name
    push("berth/store-prune", "v2s2")
    job = srun(f"-w {first} --container-image={CONTROLLER}:5000#berth/store-prune:1 true", "alice")
    assert job.rc == 0, job.stderr
    before = store_images()
    # (berth store list reads each entry's record: a squashfs's image.json,
    # or the one Berth added to a SIF file from oras://)
    aged = [line.split()[-1].rsplit("/", 1)[-1] for line in listed_sources().splitlines()
            if "berth/store-prune@" in line]
    assert len(aged) == 1, aged
    node(first).check_output(f"runuser -u berth-store -- touch -d '40 days ago' {STORE}/images/{aged[0]}")
    node(first).check_output("systemctl start berth-store-prune.service")
    assert store_images() == sorted(set(before) - set(aged))
    log = node(first).check_output("journalctl -u berth-store-prune.service -o cat --no-pager")
    assert "freed" in log and "images 1" in log, log
