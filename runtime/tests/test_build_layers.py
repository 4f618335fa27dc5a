"""A build step's change as an OCI layer (berth/build/layers.py), on real
trees: what the diff of two snapshots names (whiteouts, opaque markers,
parents before children) and the tar it writes (root's, sorted, the same
bytes for the same tree)."""

import gzip
import hashlib
import io
import os
import shutil
import tarfile

from berth.build import layers


def _tree(root):
    for d in ("keep", "gone/deep", "swapped", "was-dir/inside", "to-dir"):
        os.makedirs(root / d)
    (root / "keep/same").write_text("same\n")
    (root / "keep/edited").write_text("before\n")
    (root / "keep/removed").write_text("x\n")
    (root / "gone/deep/file").write_text("x\n")
    (root / "swapped/old").write_text("x\n")
    (root / "was-dir/inside/f").write_text("x\n")
    os.rmdir(root / "to-dir")
    (root / "to-dir").write_text("a file first\n")


def _step(root):
    """What a RUN might do: each kind of change once."""
    (root / "keep/edited").write_text("after\n")
    (root / "keep/removed").unlink()
    (root / "keep/new").write_text("new\n")
    os.link(root / "keep/new", root / "keep/new-link")
    os.symlink("new", root / "keep/sym")
    shutil.rmtree(root / "gone")
    os.mkdir(root / "new")  # (made before the old one goes: never its inode)
    (root / "new/fresh").write_text("fresh\n")
    shutil.rmtree(root / "swapped")
    os.rename(root / "new", root / "swapped")
    shutil.rmtree(root / "was-dir")
    (root / "was-dir").write_text("now a file\n")
    (root / "to-dir").unlink()
    os.mkdir(root / "to-dir")


def test_the_diff_names_each_change_and_whiteouts_come_first(tmp_path):
    _tree(tmp_path)
    before = layers.snapshot(tmp_path)
    _step(tmp_path)
    assert layers.changes(before, layers.snapshot(tmp_path)) == [
        ".wh.gone", "keep", "swapped", "to-dir", "was-dir",
        "keep/.wh.removed", "keep/edited", "keep/new", "keep/new-link", "keep/sym",
        "swapped/.wh..wh..opq", "swapped/fresh"]


def _members(blob):
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        return [(m.name, m.type, m.uid, m.gid, m.uname, m.linkname,
                 tar.extractfile(m).read() if m.isreg() else None) for m in tar]


def test_the_layer_is_a_sorted_tar_all_roots_with_links_and_whiteouts(tmp_path):
    cache, root = tmp_path / "cache", tmp_path / "root"
    root.mkdir()
    _tree(root)
    before = layers.snapshot(root)
    _step(root)
    layer = layers.write({"ENROOT_CACHE_PATH": str(cache)}, root,
                         layers.changes(before, layers.snapshot(root)))
    blob = (cache / "blobs/sha256" / layer.digest.removeprefix("sha256:")).read_bytes()
    assert layer.digest == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert layer.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()
    assert layer.size == len(blob)
    members = {m[0]: m for m in _members(blob)}
    assert list(members) == layers.changes(before, layers.snapshot(root))
    assert {(m[2], m[3], m[4]) for m in members.values()} == {(0, 0, "")}
    assert members["keep/.wh.removed"][1:] == (tarfile.REGTYPE, 0, 0, "", "", b"")
    assert members["keep/edited"][6] == b"after\n"
    assert members["keep/new-link"][1] == tarfile.LNKTYPE
    assert members["keep/new-link"][5] == "keep/new"
    assert members["keep/sym"][1:2] + members["keep/sym"][5:6] == (tarfile.SYMTYPE, "new")
    assert members["to-dir"][1] == tarfile.DIRTYPE and members["was-dir"][6] == b"now a file\n"


def test_the_same_tree_gives_the_same_digest(tmp_path):
    """Deterministic: a copy of the tree (its times kept) elsewhere, at
    another time, packs to the same bytes."""
    first = tmp_path / "first"
    first.mkdir()
    _tree(first)
    shutil.copytree(first, tmp_path / "second", symlinks=True)
    digests = set()
    for name in ("first", "second"):
        root = tmp_path / name
        everything = layers.changes(layers.Snapshot({}), layers.snapshot(root))
        digests.add(layers.write({"ENROOT_CACHE_PATH": str(tmp_path / "cache")}, root,
                                 everything).digest)
    assert len(digests) == 1
    assert os.listdir(tmp_path / "cache/blobs/sha256") == [digests.pop().split(":")[1]]
