"""bench/realistic_image.py's image, small: the same bytes from the same
arguments, and Berth's import of it is the tree its layers make as
overlayfs would (whiteouts, a directory deleted whole, an opaque one,
replaced files), entry by entry."""

import json
import os
import subprocess
import sys
from pathlib import Path

from registry_fixture import berth, berth_env, listing, tree

from berth import config
from berth.image import stream
from berth.image.layers import apply_layer, new_root

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import realistic_image

SHAPE = {"size_gib": 0.004, "files": 400, "layers": 40, "seed": 3}


def test_the_same_arguments_make_the_same_image(tmp_path):
    first = realistic_image.cached(tmp_path / "a", quiet=True, **SHAPE)
    second = realistic_image.cached(tmp_path / "b", quiet=True, **SHAPE)
    assert realistic_image.manifest_of(first) == realistic_image.manifest_of(second)
    layers = json.loads(realistic_image.manifest_of(first))["layers"]
    assert len(layers) == 40 and len({layer["digest"] for layer in layers}) > 30


def test_berth_imports_the_tree_its_layers_make(tmp_path):
    top = realistic_image.cached(tmp_path / "images", quiet=True, **SHAPE)
    layers = realistic_image.plan(SHAPE["size_gib"], SHAPE["files"], SHAPE["layers"],
                                  SHAPE["seed"])
    kinds = {kind for entries in layers for kind, *_ in entries}
    assert {"whiteout", "opaque", "hardlink", "symlink"} <= kinds
    image = tmp_path / "image.sqsh"
    result = berth(["import", "-o", str(image), f"oci:{top / 'oci'}:v1"], berth_env(tmp_path),
                   tmp_path)
    assert result.returncode == 0, result.stderr
    # (the image has no /etc: what is there is Berth's, image.json, rc and the rest)
    imported = {path for path in listing(image).splitlines()
                if path and path != "/etc" and not path.startswith("/etc/")}
    final = realistic_image.final_paths(layers)
    assert imported == {f"/{path}" for path in final}
    markers = {path for entries in layers for kind, path, *_ in entries
               if kind in ("whiteout", "opaque")}
    everything = {path for entries in layers for _, path, *_ in entries} - markers
    assert len(everything - final) > 3  # what the whiteouts deleted


def test_its_layers_packed_from_their_streams_are_the_tree_applied_in_order(tmp_path):
    """The import packs this image from its layers' streams (none of its
    layers makes it apply them in order), and what it packs is, entry by
    entry (types, modes, contents, shared inodes), the tree the layers
    make applied in order: what the import made of it before."""
    top = realistic_image.cached(tmp_path / "images", quiet=True, **SHAPE)
    manifest = json.loads(realistic_image.manifest_of(top))
    blobs = top / "oci" / "blobs" / "sha256"
    layers = [(str(blobs / layer["digest"].removeprefix("sha256:")), layer["digest"])
              for layer in manifest["layers"]]
    cfg = config.load({"HOME": str(tmp_path), "ENROOT_SYSCONF_PATH": str(tmp_path)})
    packed = tmp_path / "packed.sqsh"
    stream.squash_layers(layers, str(packed), cfg)  # (NotStreamable fails the test)
    applied = tmp_path / "applied"
    new_root(applied)
    for path, digest in layers:
        apply_layer(str(applied), path, digest, cfg["ENROOT_GZIP_PROGRAM"])
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tmp_path / "unpacked"), str(packed)],
                   check=True, stdout=subprocess.DEVNULL)
    assert tree(tmp_path / "unpacked") == tree(applied)
    assert os.stat(tmp_path / "unpacked").st_mode == os.stat(applied).st_mode
