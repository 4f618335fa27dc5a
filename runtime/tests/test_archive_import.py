"""Air-gapped `berth import`: docker-archive:, oci-archive: and oci: images,
made here with tarfile and json in the shapes `docker save` (before and
since Docker 25) and OCI image layouts have; then archives that lie."""

import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import berth, berth_env, gzipped, layer_tar, unsquash

from berth.image.imageconfig import read_image_config

pytestmark = pytest.mark.skipif(not shutil.which("mksquashfs"), reason="needs squashfs-tools")

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
BASE = layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=archived\n"),
                 ("file", "etc/old", b"old"), ("dir", "usr"), ("dir", "usr/bin"),
                 ("file", "usr/bin/tool", b"#!/bin/sh\n", 0o755))
TOP = layer_tar(("file", "etc/.wh.old", b""), ("file", "etc/added", b"added\n"))
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha(data):
    return hashlib.sha256(data).hexdigest()


def config_for(layers, arch=HOST_ARCH, env=("GREETING=from the archive",)):
    return json.dumps({"architecture": arch, "os": "linux",
                       "config": {"Env": list(env), "Cmd": ["sh"]},
                       "rootfs": {"type": "layers",
                                  "diff_ids": [f"sha256:{sha(layer)}" for layer in layers]}
                       }).encode()


def write_tar(path, entries):
    """entries: (name, bytes) files, or (name, ("symlink"|"hardlink", target))."""
    with tarfile.open(path, "w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if isinstance(data, tuple):
                kind, target = data
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = target
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def docker_save_legacy(layers=(BASE, TOP), tags=("app:v1",), config=None):
    """The entries of `docker save` before Docker 25: <id>/layer.tar, <hex>.json."""
    config = config or config_for(layers)
    entries = [(f"{sha(config)}.json", config)]
    names = []
    for number, layer in enumerate(layers):
        layer_id = sha(f"layer-{number}".encode())
        entries += [(f"{layer_id}/VERSION", b"1.0"), (f"{layer_id}/layer.tar", layer)]
        names.append(f"{layer_id}/layer.tar")
    manifest = [{"Config": f"{sha(config)}.json", "RepoTags": list(tags), "Layers": names}]
    entries.append(("manifest.json", json.dumps(manifest).encode()))
    return entries


def oci_layout(images, compress=True):
    """Entries of an OCI layout: images is [(ref name or None, layers, config)];
    returns (entries, {ref: manifest digest})."""
    blobs, descriptors, digests = {}, [], {}

    def blob(data):
        blobs[f"blobs/sha256/{sha(data)}"] = data
        return f"sha256:{sha(data)}"

    for ref, layers, config in images:
        packed = [gzipped(layer) if compress else layer for layer in layers]
        config = config or config_for(layers)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": blob(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": blob(layer), "size": len(layer)} for layer in packed],
        }).encode()
        descriptor = {"mediaType": OCI_MANIFEST, "digest": blob(manifest),
                      "size": len(manifest)}
        if ref:
            descriptor["annotations"] = {"org.opencontainers.image.ref.name": ref}
        descriptors.append(descriptor)
        digests[ref] = descriptor["digest"]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descriptors}
    entries = [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
               ("index.json", json.dumps(index).encode()), *blobs.items()]
    return entries, digests


def write_dir(path, entries):
    for name, data in entries:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


@pytest.fixture
def env(tmp_path):
    return berth_env(tmp_path)


def imported(tmp_path, env, uri, *extra):
    result = berth(["import", *extra, uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    return result


def check_root(tmp_path, image):
    root = unsquash(image, tmp_path / "root")
    assert (root / "etc/os-release").read_text() == "ID=archived\n"
    assert (root / "etc/added").read_text() == "added\n"
    assert not (root / "etc/old").exists()  # the whiteout of the upper layer applied
    return root


def one_line_error(result, *needles):
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("berth: error: ") and result.stderr.count("\n") == 1, \
        result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr


def nothing_written(tmp_path):
    assert list(tmp_path.glob("*.sqsh*")) == []
    blobs = tmp_path / "cache/blobs/sha256"
    assert not blobs.exists() or [p.name for p in blobs.iterdir() if p.name[0] == "."] == []
    images = tmp_path / "cache/images"
    assert not images.exists() or list(images.iterdir()) == []
    assert list((tmp_path / "temp").iterdir()) == []


# -- the formats ---------------------------------------------------------------

def test_docker_save_legacy_archive(tmp_path, env):
    archive = write_tar(tmp_path / "app.tar", docker_save_legacy())
    uri = f"docker-archive:{archive}"
    result = imported(tmp_path, env, uri)
    assert result.stderr.startswith(f"berth: imported {uri} to {tmp_path}/app.sqsh (")
    assert result.stderr.count("\n") == 1
    root = check_root(tmp_path, tmp_path / "app.sqsh")  # named after the file
    config = read_image_config(root)
    assert config["env"] == ["GREETING=from the archive"]
    assert config["source"] == uri
    assert config["digest"] == f"sha256:{sha(config_for([BASE, TOP]))}"
    # The layers went into the layer cache under their digests (the diff_ids).
    cached = sorted(p.name for p in (tmp_path / "cache/blobs/sha256").iterdir())
    assert cached == sorted([sha(BASE), sha(TOP)])


def test_docker_save_oci_style_archive(tmp_path, env):
    """Docker 25+: an OCI layout, plus manifest.json naming blobs/sha256/..."""
    layers = [BASE, TOP]
    config = config_for(layers)
    entries, _ = oci_layout([("docker.io/library/app:v1", layers, config)], compress=False)
    manifest = [{"Config": f"blobs/sha256/{sha(config)}", "RepoTags": ["app:v1"],
                 "Layers": [f"blobs/sha256/{sha(layer)}" for layer in layers]}]
    entries.append(("manifest.json", json.dumps(manifest).encode()))
    archive = write_tar(tmp_path / "new.tar", entries)
    imported(tmp_path, env, f"docker-archive:{archive}:app:v1", "-o", "out.sqsh")
    check_root(tmp_path, tmp_path / "out.sqsh")


def test_docker_archive_with_several_images_needs_a_choice(tmp_path, env):
    entries = docker_save_legacy()
    other = config_for([BASE], env=("WHICH=other",))
    layer_id = sha(b"other")
    entries += [(f"{sha(other)}.json", other), (f"{layer_id}/layer.tar", BASE)]
    manifest = [_manifest_of(entries)[0],
                {"Config": f"{sha(other)}.json", "RepoTags": ["other:v2"],
                 "Layers": [f"{layer_id}/layer.tar"]}]
    entries = replace(entries, "manifest.json", json.dumps(manifest).encode())
    archive = write_tar(tmp_path / "two.tar", entries)
    one_line_error(berth(["import", f"docker-archive:{archive}"], env, tmp_path),
                   "holds 2 images", "app:v1", "other:v2")
    imported(tmp_path, env, f"docker-archive:{archive}:other:v2", "-o", "b.sqsh")
    assert read_image_config(unsquash(tmp_path / "b.sqsh", tmp_path / "b"))["env"] == \
        ["WHICH=other"]
    imported(tmp_path, env, f"docker-archive:{archive}:@0", "-o", "a.sqsh")
    check_root(tmp_path, tmp_path / "a.sqsh")
    one_line_error(berth(["import", f"docker-archive:{archive}:nope:v1"], env, tmp_path),
                   "no image tagged 'nope:v1'")
    for index in ("@\u00b2", "@" + "9" * 5000):  # (str.isdigit() took both; int() did not)
        one_line_error(berth(["import", f"docker-archive:{archive}:{index}"], env, tmp_path),
                       f"no image {index}: it holds 2")


def test_legacy_layer_shared_by_a_symlink(tmp_path, env):
    """docker save stores a layer twice as a symlink to the first copy."""
    entries = docker_save_legacy(layers=(BASE, TOP, BASE))
    manifest = json.loads(dict(entries)["manifest.json"])
    third = manifest[0]["Layers"][2]
    entries = [e for e in entries if e[0] != third]
    entries.insert(-1, (third, ("symlink", "../" + manifest[0]["Layers"][0])))
    archive = write_tar(tmp_path / "dup.tar", entries)
    imported(tmp_path, env, f"docker-archive:{archive}", "-o", "dup.sqsh")
    assert (unsquash(tmp_path / "dup.sqsh", tmp_path / "r") / "etc/old").exists()


def test_oci_layout_directory_and_archive(tmp_path, env):
    entries, digests = oci_layout([("v1", [BASE, TOP], None)])
    layout = write_dir(tmp_path / "layout", entries)
    imported(tmp_path, env, f"oci:{layout}")
    root = check_root(tmp_path, tmp_path / "layout.sqsh")
    assert read_image_config(root)["digest"] == digests["v1"]
    archive = write_tar(tmp_path / "layout.oci.tar", entries)
    imported(tmp_path, env, f"oci-archive:{archive}:v1", "-o", "b.sqsh")
    assert read_image_config(unsquash(tmp_path / "b.sqsh", tmp_path / "b"))["digest"] == \
        digests["v1"]


def test_oci_layout_with_several_images_and_a_multi_platform_index(tmp_path, env):
    entries, digests = oci_layout([("one", [BASE, TOP], None),
                                   ("two", [BASE], config_for([BASE], env=("WHICH=two",)))])
    layout = write_dir(tmp_path / "layout", entries)
    one_line_error(berth(["import", f"oci:{layout}"], env, tmp_path),
                   "holds 2 images", "'one'", "'two'", f"oci:{layout}:NAME")
    imported(tmp_path, env, f"oci:{layout}:two", "-o", "two.sqsh")
    assert read_image_config(unsquash(tmp_path / "two.sqsh", tmp_path / "t"))["env"] == \
        ["WHICH=two"]
    one_line_error(berth(["import", f"oci:{layout}:three"], env, tmp_path),
                   "no image named 'three'")

    # A multi-platform image: its index in a blob, the platform picked by --arch.
    other = "arm64" if HOST_ARCH != "arm64" else "amd64"
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digests["two"],
         "size": len(dict(entries)[f"blobs/sha256/{digests['two'][7:]}"]),
         "platform": {"os": "linux", "architecture": other}},
        {"mediaType": OCI_MANIFEST, "digest": digests["one"],
         "size": len(dict(entries)[f"blobs/sha256/{digests['one'][7:]}"]),
         "platform": {"os": "linux", "architecture": HOST_ARCH}}]}).encode()
    (layout / f"blobs/sha256/{sha(index)}").write_bytes(index)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_INDEX, "digest": f"sha256:{sha(index)}", "size": len(index),
         "annotations": {"org.opencontainers.image.ref.name": "multi"}}]}))
    imported(tmp_path, env, f"oci:{layout}", "-o", "host.sqsh")
    config = read_image_config(check_root(tmp_path, tmp_path / "host.sqsh"))
    assert config["digest"] == f"sha256:{sha(index)}"  # what was asked for, as from a registry
    imported(tmp_path, env, f"oci:{layout}", "-o", "other.sqsh", "--arch", other)
    assert read_image_config(unsquash(tmp_path / "other.sqsh", tmp_path / "o"))["env"] == \
        ["WHICH=two"]


def test_a_gzipped_docker_save(tmp_path, env):
    plain = write_tar(tmp_path / "plain.tar", docker_save_legacy())
    (tmp_path / "app.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
    imported(tmp_path, env, f"docker-archive:{tmp_path / 'app.tar.gz'}")
    check_root(tmp_path, tmp_path / "app.sqsh")
    assert list((tmp_path / "temp").iterdir()) == []


def test_cache_only_and_the_cache_key(tmp_path, env):
    """--cache-only prints the cached image; a second import of the same
    archive builds nothing: the key is the config/manifest digest."""
    archive = write_tar(tmp_path / "app.tar", docker_save_legacy())
    first = imported(tmp_path, env, f"docker-archive:{archive}", "--cache-only")
    path = first.stdout.strip()
    assert re.fullmatch(r".*/cache/images/[0-9a-f]{64}\.sqsh", path), first.stdout
    check_root(tmp_path, path)
    # Layers gone from the cache: a rebuild would read them from the archive
    # again; the image entry serves instead, the same file (not rebuilt).
    shutil.rmtree(tmp_path / "cache/blobs")
    inode = os.stat(path).st_ino
    again = berth(["import", f"docker-archive:{archive}", "--cache-only"], env, tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == path, again.stderr
    assert "using the cached squashfs" in again.stderr
    assert os.stat(path).st_ino == inode
    assert not (tmp_path / "cache/blobs/sha256").exists() or \
        list((tmp_path / "cache/blobs/sha256").iterdir()) == []


def test_progress_and_quiet(tmp_path, env):
    from test_import import on_a_terminal  # the registry imports' terminal helper
    archive = write_tar(tmp_path / "app.tar", docker_save_legacy())
    status, shown = on_a_terminal(["import", "-o", "a.sqsh", f"docker-archive:{archive}"],
                                  env, tmp_path)
    assert status == 0 and "reading" in shown and "packing" in shown, shown
    status, shown = on_a_terminal(["-q", "import", "-o", "b.sqsh",
                                   f"docker-archive:{archive}"], env, tmp_path)
    assert status == 0 and shown.strip() == "", shown


def test_dry_run_reads_nothing(tmp_path, env):
    result = berth(["import", "--dry-run", "docker-archive:missing.tar"], env, tmp_path)
    assert result.returncode == 0 and result.stdout == \
        f"docker-archive:{tmp_path}/missing.tar (a local archive: no registry is asked)\n"
    assert not (tmp_path / "cache").exists()


# -- archives that lie -----------------------------------------------------------

def hostile_docker(tmp_path, change):
    entries = docker_save_legacy()
    entries = change(entries) or entries
    return write_tar(tmp_path / "bad.tar", entries)


def _manifest_of(entries):
    return json.loads(dict((n, d) for n, d in entries if not isinstance(d, tuple))
                      ["manifest.json"])


def replace(entries, name, data):
    return [(n, data if n == name else d) for n, d in entries]


HOSTILE = {
    "traversal entry": (lambda e: e + [("../../evil", b"x")], "'../../evil' points outside"),
    "absolute entry": (lambda e: e + [("/etc/evil", b"x")], "'/etc/evil' points outside"),
    "symlinked manifest.json": (
        lambda e: [x for x in e if x[0] != "manifest.json"]
        + [("real.json", dict(e)["manifest.json"]), ("manifest.json", ("symlink", "real.json"))],
        "'manifest.json' is a link"),
    "layer link out of the archive": (
        lambda e: [(n, ("symlink", "../../../etc/passwd") if n.endswith("layer.tar") else d)
                   for n, d in e], "points outside the archive"),
    "layer link in a circle": (
        lambda e: [(n, ("symlink", "layer.tar") if n.endswith("layer.tar") else d)
                   for n, d in e], "too many levels of links"),
    "digest mismatch of a layer": (
        lambda e: [(n, TOP if n.endswith("layer.tar") else d) for n, d in e],
        "layer digest mismatch"),
    "digest mismatch of the config": (
        lambda e: [(n, d + b" " if n.endswith(".json") and n != "manifest.json" else d)
                   for n, d in e], "blob digest mismatch"),
    "missing layer": (
        lambda e: [x for x in e if not x[0].endswith("layer.tar")], "is missing"),
    "huge manifest": (lambda e: replace(e, "manifest.json", b"[" + b" " * (5 << 20) + b"]"),
                      "more than the 4 MiB"),
    "manifest not JSON": (lambda e: replace(e, "manifest.json", b"{"), "is not JSON"),
    "duplicate entry": (lambda e: e + [("manifest.json", b"[]")], "appears twice"),
    "path traversal in Layers": (
        lambda e: replace(e, "manifest.json", json.dumps(
            [dict(_manifest_of(e)[0], Layers=["../outside/layer.tar"])]).encode()),
        "points outside the archive"),
    "compressed layer without a digest": (
        lambda e: [(n, gzipped(d) if n.endswith("layer.tar") else d) for n, d in e],
        "compressed and named by no digest"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_docker_archive_is_refused(tmp_path, env, case):
    change, needle = HOSTILE[case]
    archive = hostile_docker(tmp_path, change)
    result = berth(["import", f"docker-archive:{archive}"], env, tmp_path)
    one_line_error(result, f"docker-archive:{archive}", needle)
    nothing_written(tmp_path)


def test_not_a_tar_and_not_there(tmp_path, env):
    (tmp_path / "junk.tar").write_bytes(os.urandom(4096))
    one_line_error(berth(["import", f"docker-archive:{tmp_path / 'junk.tar'}"], env, tmp_path),
                   "junk.tar", "not a valid tar archive")
    one_line_error(berth(["import", f"oci-archive:{tmp_path / 'none.tar'}"], env, tmp_path),
                   "none.tar", "No such file")
    one_line_error(berth(["import", f"oci:{tmp_path / 'none'}"], env, tmp_path),
                   "none", "is not a directory")
    nothing_written(tmp_path)


def test_a_fifo_in_place_of_an_archive_or_a_layout_file_is_refused_at_once(tmp_path, env):
    """A FIFO opened blocking waits for a writer that never comes: the import
    hung in open() before it could see what the file was."""
    os.mkfifo(tmp_path / "pipe.tar")
    for uri in (f"docker-archive:{tmp_path / 'pipe.tar'}", f"oci-archive:{tmp_path / 'pipe.tar'}"):
        one_line_error(berth(["import", uri], env, tmp_path, timeout=30), "pipe.tar",
                       "is not a file")
    entries, _ = oci_layout([("v1", [BASE, TOP], None)])
    layer = next(n for n, d in entries if n.startswith("blobs/") and d[:2] == b"\x1f\x8b")
    for fifo, name in (("index.json", "i"), (layer, "l")):
        layout = write_dir(tmp_path / name, [e for e in entries if e[0] != fifo])
        os.mkfifo(layout / fifo)
        one_line_error(berth(["import", f"oci:{layout}"], env, tmp_path, timeout=30),
                       f"'{fifo}' is not a regular file")
    nothing_written(tmp_path)


@pytest.mark.parametrize("platform_entry", [
    {"digest": "sha256:zz", "size": 10},
    {"size": 10},
    {"digest": 5, "size": 10},
], ids=["bad-digest", "no-digest", "number-digest"])
def test_an_index_entry_of_the_wrong_shape_is_malformed_not_a_traceback(tmp_path, env,
                                                                       platform_entry):
    entries, digests = oci_layout([(None, [BASE, TOP], None)])
    index = json.loads(dict(entries)["index.json"])
    good = dict(index["manifests"][0], platform={"os": "linux", "architecture": "arm64"})
    hostile = dict(platform_entry, platform={"os": "linux", "architecture": HOST_ARCH})
    index["manifests"] = [good, hostile]
    layout = write_dir(tmp_path / "layout",
                       replace(entries, "index.json", json.dumps(index).encode()))
    one_line_error(berth(["import", f"oci:{layout}"], env, tmp_path), f"oci:{layout}",
                   "is malformed")
    nothing_written(tmp_path)


def test_hostile_oci_layouts(tmp_path, env):
    entries, digests = oci_layout([("v1", [BASE, TOP], None)])
    layer = next(n for n, d in entries if n.startswith("blobs/") and d[:2] == b"\x1f\x8b")

    def refused(entries, *needles, name="x"):
        layout = write_dir(tmp_path / name, entries)
        one_line_error(berth(["import", f"oci:{layout}"], env, tmp_path), f"oci:{layout}",
                       *needles)
        nothing_written(tmp_path)

    # A layer whose bytes are not those of its digest (same size).
    data = dict(entries)[layer]
    refused(replace(entries, layer, bytes([data[0], data[1]]) + b"\0" * (len(data) - 2)),
            "layer digest mismatch", name="a")
    # A layer of another size than its descriptor says.
    refused(replace(entries, layer, data + b"more"), "bytes; its descriptor says", name="b")
    # A missing blob.
    refused([e for e in entries if e[0] != layer], f"blob sha256:{layer[13:]} is missing",
            name="c")
    # index.json as a symlink.
    layout = write_dir(tmp_path / "d", [e for e in entries if e[0] != "index.json"])
    (layout / "real.json").write_bytes(dict(entries)["index.json"])
    (layout / "index.json").symlink_to("real.json")
    one_line_error(berth(["import", f"oci:{layout}"], env, tmp_path), "'index.json' is a link")
    # A manifest blob changed behind its digest.
    manifest = f"blobs/sha256/{digests['v1'][7:]}"
    refused(replace(entries, manifest, dict(entries)[manifest].replace(b"gzip", b"gzi ")),
            "blob digest mismatch", name="e")
    # A descriptor with a digest that would name another path.
    index = json.loads(dict(entries)["index.json"])
    index["manifests"][0]["digest"] = "sha256:../../../etc/passwd"
    refused(replace(entries, "index.json", json.dumps(index).encode()),
            "unsupported digest", name="f")
    # A huge declared manifest.
    index["manifests"][0].update(digest=digests["v1"], size=100 << 20)
    refused(replace(entries, "index.json", json.dumps(index).encode()),
            "more than the 4 MiB", name="g")
