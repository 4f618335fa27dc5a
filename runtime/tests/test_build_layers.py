"""A build step's change as an OCI layer (berth/build/layers.py), on real
trees: what the diff of two snapshots names (whiteouts, opaque markers,
parents before children) and the tar it writes (root's, sorted, the same
bytes for the same tree), and such a layer applied to a tree
(berth/build/restore.py)."""

import gzip
import hashlib
import io
import os
import shutil
import tarfile

import pytest

from berth.build import layers, restore
from berth.errors import BerthError


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
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
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
    blob = (cache / "blobs/sha256" / layer.diff_id.removeprefix("sha256:")).read_bytes()
    assert layer.diff_id == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert layer.size == len(blob) and layer.digest is None  # (no gzip until an output asks)
    cfg = {"ENROOT_CACHE_PATH": str(cache)}
    packed = layers.compressed(cfg, "0" * 64, layer)
    gzipped = (cache / "blobs/sha256" / packed.digest.removeprefix("sha256:")).read_bytes()
    assert packed.digest == "sha256:" + hashlib.sha256(gzipped).hexdigest()
    assert gzip.decompress(gzipped) == blob and packed.packed_size == len(gzipped)
    assert layers.kept(cfg, "0" * 64) == packed  # (recorded: made once)
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
        cfg = {"ENROOT_CACHE_PATH": str(tmp_path / "cache")}
        layer = layers.write(cfg, root, everything)
        digests.add((layer.diff_id, layers.compressed(cfg, "0" * 64, layer).digest))
    assert len(digests) == 1
    assert sorted(os.listdir(tmp_path / "cache/blobs/sha256")) == sorted(
        digest.split(":")[1] for digest in digests.pop())


def _entries(root):
    """Each entry of `root`: type, mode, content or link target, and which
    names share its inode (hard links)."""
    found, inodes = {}, {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            relative = os.path.relpath(path, root)
            inodes.setdefault(st.st_ino, []).append(relative)
            body = os.readlink(path) if os.path.islink(path) else \
                open(path, "rb").read() if os.path.isfile(path) else None
            found[relative] = (st.st_mode, body, st.st_ino)
    return {path: (mode, body, sorted(inodes[ino])) for path, (mode, body, ino) in found.items()}


def test_a_layer_applied_to_the_tree_before_makes_the_tree_after(tmp_path):
    """restore.apply, as a rebuild puts a cached step back: its whiteouts
    remove, its opaque directory replaces, a hard link stays one."""
    cfg = {"ENROOT_CACHE_PATH": str(tmp_path / "cache")}
    after, before_copy = tmp_path / "after", tmp_path / "before"
    after.mkdir()
    _tree(after)
    (after / "keep/linked").write_text("two names\n")
    os.link(after / "keep/linked", after / "keep/linked-too")
    shutil.copytree(after, before_copy, symlinks=True)
    (before_copy / "keep/linked-too").unlink()  # (copytree copies a hard link twice)
    os.link(before_copy / "keep/linked", before_copy / "keep/linked-too")
    before = layers.snapshot(after)
    _step(after)
    os.chmod(after / "keep/new", 0o4755)
    (after / "keep/linked").unlink()
    (after / "keep/linked").write_text("replaced, its other name kept\n")
    layer = layers.write(cfg, after, layers.changes(before, layers.snapshot(after)))
    restore.apply(before_copy, layers.blob_path(cfg, layer))
    assert _entries(before_copy) == _entries(after)
    assert (before_copy / "keep/linked-too").read_text() == "two names\n"


def _hostile(path, *members):
    with tarfile.open(path, "w") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = b"x" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("members", [
    [("../out", tarfile.REGTYPE, "")],
    [("/abs", tarfile.REGTYPE, "")],
    [("up", tarfile.SYMTYPE, ".."), ("up/out", tarfile.REGTYPE, "")],
    [("up", tarfile.SYMTYPE, ".."), ("up/.wh.victim", tarfile.REGTYPE, "")],
    [("hard", tarfile.LNKTYPE, "../victim")],
], ids=["dotdot", "absolute", "through-a-symlink", "whiteout-through-a-symlink", "hard-link-out"])
def test_a_layer_that_leaves_the_tree_is_refused(tmp_path, members):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "victim").write_text("kept\n")
    _hostile(tmp_path / "layer.tar", *members)
    with pytest.raises(BerthError, match="layer"):
        restore.apply(root, str(tmp_path / "layer.tar"))
    assert sorted(os.listdir(tmp_path)) == ["layer.tar", "root", "victim"]
    assert (tmp_path / "victim").read_text() == "kept\n"
