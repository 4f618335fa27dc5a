"""SIF images kept in a registry as Apptainer pushes them (`apptainer push
app.sif oras://REGISTRY/NS/IMAGE:TAG`: an OCI artifact whose one layer is
the SIF file), pulled into the image cache, digest-checked, and started in
place. A real registry (Debian's docker-registry) behind the counting proxy;
the SIF files by siftool, as test_sif.py makes them; its fixtures and
test_container's (the user `berthtest` when run as root)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import OCI_MANIFEST, Registry
from test_sif import sifs  # noqa: F401 (fixture)
from test_start_uri import pulling  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not shutil.which("docker-registry"),
                                reason="needs docker-registry (Debian package docker-registry)")

SIF_CONFIG = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER = "application/vnd.sylabs.sif.layer.v1.sif"


def push_sif(registry, repo, tag, data, layer_type=SIF_LAYER, extra_layers=()):
    """Push `data` (a SIF file's bytes) as Apptainer does: an OCI manifest,
    an empty JSON config of the SIF config type, the file its one layer."""
    config = b"{}"
    layers = [(layer_type, data), *extra_layers]
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": SIF_CONFIG, "size": len(config),
                   "digest": registry.push_blob(repo, config)},
        "layers": [{"mediaType": kind, "size": len(blob), "digest": registry.push_blob(repo, blob),
                    "annotations": {"org.opencontainers.image.title": "app.sif"}}
                   for kind, blob in layers],
    }
    return registry.push_manifest(repo, tag, manifest, OCI_MANIFEST)


@pytest.fixture(scope="module")
def registry(tmp_path_factory, sifs):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.sif = (sifs / "signed.sif").read_bytes()
    reg.sif_digest = push_sif(reg, "apps/sif", "1", reg.sif)
    yield reg
    reg.stop()


def test_an_oras_image_is_pulled_once_and_started_in_place(pulling, registry):
    berth = pulling
    uri = f"oras://{registry.host}/apps/sif:1"
    out = berth.ok("start", uri, "sh", "-c", 'echo "$FROM_SIF"; sif-tool')
    assert out.splitlines() == ["set-by-image", "sif-tool on PATH"]
    [entry] = (berth.base / "cache/images").glob("*.sqsh")
    # the cached entry is the SIF file as the registry sent it, its data
    # objects untouched, plus Berth's record (its header and table updated)
    kept = entry.read_bytes()
    assert kept[128:4096] == registry.sif[128:4096]
    assert kept[32768:len(registry.sif)] == registry.sif[32768:]
    assert json.loads(kept[len(registry.sif):]) == {"source": uri,
                                                    "digest": registry.sif_digest}
    listing = subprocess.run(["siftool", "list", str(entry)], capture_output=True, text=True,
                             check=True).stdout
    assert "JSON.Generic" in listing and "*System" in listing  # siftool still reads it
    # the digest it was pulled by, as for a Docker image: what the plugin logs
    path, digest = berth.ok("import", "--cache-only", "--digest", uri).splitlines()
    assert (path, digest) == (str(entry), registry.sif_digest)
    # a second start downloads nothing and makes nothing
    assert berth.ok("start", "--reuse", uri, "sh", "-c", "echo $FROM_SIF") == "set-by-image\n"
    assert list((berth.base / "cache/images").glob("*.sqsh")) == [entry]
    # what the plugin does for named and writable containers
    berth.ok("create", "-n", "from-oras", entry)
    assert berth.ok("start", "from-oras", "sh", "-c", "echo $FROM_SIF") == "set-by-image\n"
    assert berth.ok("start", "--rw", uri, "sh", "-c", "touch /new && echo $FROM_SIF") == \
        "set-by-image\n"
    # berth import copies the SIF file out, named after the image
    berth.ok("import", uri)
    assert (berth.base / "apps+sif+1.sif").read_bytes() == kept
    assert berth.leftovers() == []


def test_a_pinned_oras_reference_resolves_to_its_digest(pulling, registry):
    uri = f"oras://{registry.host}/apps/sif:1"
    assert pulling.ok("import", "--resolve", uri) == \
        f"oras://{registry.host}/apps/sif@{registry.sif_digest}\n"
    assert pulling.ok("start", f"oras://{registry.host}/apps/sif@{registry.sif_digest}",
                      "sh", "-c", "echo $FROM_SIF") == "set-by-image\n"


@pytest.mark.parametrize("name, needle", [
    ("tampered", "digest"),  # the layer's bytes do not match its digest
    ("two-layers", "not a SIF image: a SIF artifact has one layer"),
    ("docker-layer", "not a SIF image: a SIF artifact has one layer"),
    ("other-arch", "built for"),
    ("truncated", "lie outside the"),
    # a record of its own would pass for Berth's: a false source and digest in the cache
    ("forged-record", "holds a berth-image.json object already"),
])
def test_hostile_oras_images_are_refused_in_one_line_leaving_no_entry(
        pulling, registry, sifs, tmp_path, name, needle):
    repo = f"bad/{name}"
    if name == "tampered":
        good = (sifs / "app.sif").read_bytes()
        digest = registry.push_blob(repo, good)
        bad = bytearray(good)
        bad[40000] ^= 0xFF  # the registry's blob swapped under the manifest: a lying mirror
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": {"mediaType": SIF_CONFIG, "size": 2,
                               "digest": registry.push_blob(repo, b"{}")},
                    "layers": [{"mediaType": SIF_LAYER, "size": len(good), "digest": digest}]}
        registry.push_manifest(repo, "1", manifest, OCI_MANIFEST)
        blob = next(Path(registry.log.name).parent.glob(
            f"storage/docker/registry/v2/blobs/sha256/{digest[7:9]}/{digest[7:]}/data"))
        blob.write_bytes(bytes(bad))
    elif name == "two-layers":
        push_sif(registry, repo, "1", (sifs / "app.sif").read_bytes(),
                 extra_layers=[(SIF_LAYER, b"more")])
    elif name == "docker-layer":
        push_sif(registry, repo, "1", b"not a sif",
                 layer_type="application/vnd.oci.image.layer.v1.tar+gzip")
    elif name == "forged-record":
        record = tmp_path / "berth-image.json"
        record.write_text('{"source": "docker://trusted/image:1", "digest": "sha256:%s"}'
                          % ("0" * 64))
        forged = tmp_path / "forged.sif"
        forged.write_bytes((sifs / "app.sif").read_bytes())
        subprocess.run(["siftool", "add", str(forged), str(record), "--datatype", "6",
                        "--filename", record.name], check=True, capture_output=True)
        push_sif(registry, repo, "1", forged.read_bytes())
    else:
        push_sif(registry, repo, "1", (sifs / f"{name}.sif").read_bytes())
    pulling.fails("start", f"oras://{registry.host}/{repo}:1", "true", needle=needle)
    assert list((pulling.base / "cache/images").glob("*")) == []


def test_an_oras_name_that_is_no_sif_is_refused(pulling, registry):
    """A Docker image named with oras:// is not run as one."""
    registry.push_image("plain/image", "1", [b"\x1f\x8b"], {"architecture": "amd64",
                                                             "os": "linux"})
    pulling.fails("start", f"oras://{registry.host}/plain/image:1", "true",
                  needle="not a SIF image")
    pulling.fails("start", "oras://no-slash", "true",
                  needle="expected oras://REGISTRY[:PORT]/IMAGE[:TAG|@DIGEST]")
