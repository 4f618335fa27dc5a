"""Layer application: overlay semantics and no way out of the root."""

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import gzipped, layer_tar, zstd_compressed

from berth.errors import BerthError
from berth.image.layers import apply_layer, resolve


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path):
    """A directory next to the root that no layer may touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep")
    return outside


def apply(root, *layers):
    for number, data in enumerate(layers):
        path = root.parent / f"layer{number}"
        path.write_bytes(data)
        apply_layer(str(root), str(path), f"sha256:{number:064x}", "gzip")


def tree(directory):
    return sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*"))


def test_files_dirs_links_in_order(root):
    apply(root,
          gzipped(layer_tar(("dir", "etc"), ("file", "etc/a", b"one"),
                            ("symlink", "etc/b", "a"), ("hardlink", "etc/c", "etc/a"))),
          zstd_compressed(layer_tar(("file", "etc/a", b"two"))))
    assert (root / "etc/a").read_text() == "two"
    assert os.readlink(root / "etc/b") == "a"
    assert (root / "etc/c").read_text() == "one"  # the hard link kept the old file
    assert os.stat(root / "etc/a").st_mtime == 1_700_000_000


def test_whiteout_removes_file_and_directory(root):
    apply(root,
          layer_tar(("dir", "d"), ("file", "d/x", b"x"), ("file", "f", b"f"), ("file", "g", b"g")),
          layer_tar(("file", ".wh.d", b""), ("file", ".wh.f", b"")))
    assert tree(root) == ["g"]


def test_opaque_directory_keeps_only_the_new_layer(root):
    apply(root,
          layer_tar(("dir", "d"), ("file", "d/old", b"o"), ("dir", "d/sub"),
                    ("file", "d/sub/y", b"")),
          layer_tar(("dir", "d"), ("file", "d/new", b"n"), ("file", "d/.wh..wh..opq", b"")))
    assert tree(root) == ["d", "d/new"]


@pytest.mark.parametrize("name", ["d/.wh.", "d/.wh..", "d/.wh..."])
def test_whiteouts_of_no_file_are_refused(root, name):
    apply(root, layer_tar(("dir", "d"), ("file", "d/x", b"x")))
    with pytest.raises(BerthError, match=f"whiteout '{name}' names no file"):
        apply(root, layer_tar(("file", name, b"")))
    assert tree(root) == ["d", "d/x"]


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/evil"])
def test_entries_outside_the_root_are_refused(root, name):
    with pytest.raises(BerthError, match="points outside the image root"):
        apply(root, layer_tar(("file", name, b"x")))
    assert not (root.parent / "evil").exists()
    assert not Path("/evil").exists()


@pytest.mark.parametrize("target", ["{outside}", "../outside", "../../../../../{outside}"])
def test_writing_through_a_symlink_stays_inside(root, outside, target):
    link = target.format(outside=outside)
    apply(root, layer_tar(("symlink", "esc", link)),
          layer_tar(("file", "esc/secret", b"pwned"), ("file", "esc/new", b"pwned")))
    assert (outside / "secret").read_text() == "keep"
    assert sorted(os.listdir(outside)) == ["secret"]
    # The write landed where the link points when the root is '/'.
    landed = Path(resolve(str(root), "esc", follow_last=True))
    assert str(landed).startswith(str(root) + "/")
    assert (landed / "new").read_text() == "pwned"


def test_a_file_replaces_a_symlink_instead_of_writing_through_it(root, outside):
    apply(root, layer_tar(("symlink", "s", f"{outside}/secret")),
          layer_tar(("file", "s", b"pwned")))
    assert (outside / "secret").read_text() == "keep"
    assert not (root / "s").is_symlink()
    assert (root / "s").read_text() == "pwned"


def test_hard_links_cannot_reach_outside(root, outside):
    with pytest.raises(BerthError, match="points outside the image root"):
        apply(root, layer_tar(("hardlink", "h", "../outside/secret")))
    # Through a symlink the target resolves inside the root, where it is missing.
    with pytest.raises(BerthError, match="hard link 'h2' to missing"):
        apply(root, layer_tar(("symlink", "esc", str(outside))),
              layer_tar(("hardlink", "h2", "esc/secret")))
    assert os.stat(outside / "secret").st_nlink == 1


def test_devices_skipped_fifos_kept_setuid_dropped(root):
    apply(root, layer_tar(("char", "null"), ("fifo", "pipe"),
                          ("file", "suid", b"#!", 0o6755), ("file", "locked", b"s", 0o000),
                          ("dir", "tmp", 0o1777)))
    assert not (root / "null").exists()
    assert stat.S_ISFIFO(os.lstat(root / "pipe").st_mode)
    assert stat.S_IMODE(os.stat(root / "suid").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "locked").st_mode) == 0o400  # owner can still pack it
    assert stat.S_IMODE(os.stat(root / "tmp").st_mode) == 0o1777


def test_symlink_loop_is_an_error(root):
    with pytest.raises(BerthError, match="too many levels of symbolic links"):
        apply(root, layer_tar(("symlink", "a", "b"), ("symlink", "b", "a"),
                              ("file", "a/x", b"")))


def test_corrupt_compressed_layer_names_the_layer(root):
    with pytest.raises(BerthError, match=r"layer sha256:0{64}: gzip -d failed"):
        apply(root, gzipped(layer_tar(("file", "f", b"x" * 5000)))[:-30])


def test_refused_entry_in_compressed_layer_is_reported_as_such(root):
    # Plenty of data after the bad entry: the decompressor is cut off mid-stream.
    data = os.urandom(4 << 20)
    with pytest.raises(BerthError, match="points outside the image root"):
        apply(root, gzipped(layer_tar(("file", "../evil", b"x"), ("file", "big", data))))
    with pytest.raises(BerthError, match="points outside the image root"):
        apply(root, zstd_compressed(layer_tar(("file", "../evil", b"x"), ("file", "big", data))))


def test_not_a_tar_names_the_layer(root):
    with pytest.raises(BerthError, match=r"layer sha256:0{64} is not a valid tar"):
        apply(root, b"this is no tar archive at all" * 40)


def test_a_directory_removed_later_in_its_layer_keeps_no_time_to_set(root):
    apply(root, layer_tar(("dir", "d"), ("file", ".wh.d", b"")))
    assert tree(root) == []


def test_a_parent_made_a_symlink_later_in_the_layer_sets_no_time_outside(root, outside):
    (outside / "b").mkdir()
    before = os.stat(outside / "b").st_mtime
    apply(root, layer_tar(("dir", "a"), ("dir", "a/b"), ("file", ".wh.a", b""),
                          ("symlink", "a", str(outside))))
    assert os.stat(outside / "b").st_mtime == before


def test_a_parent_made_a_file_later_in_the_layer_keeps_no_time_to_set(root):
    """The fuzz test's find: a directory's deferred time under a parent that a
    later entry replaced with a file was a NotADirectoryError traceback."""
    apply(root, layer_tar(("dir", "a/a"), ("file", "a", b"now a file")))
    assert (root / "a").read_bytes() == b"now a file"
