"""Layers packed without unpacking them (image/stream.py) against the same
layers applied in order (layers.apply_layer) and packed with mksquashfs:
for random layer stacks of every kind of entry, names that collide, links
through and over each other, whiteouts and opaque markers, the packed tree
is the applied one entry by entry, or the merge declines (NotStreamable)
and the import applies the layers itself. Where the layers are refused,
the merge refuses or declines too."""

import errno
import gzip
import os
import random
import stat
import subprocess
import tarfile

from hypothesis import HealthCheck, event, given, settings, strategies as st

from registry_fixture import tree
from test_layers_fuzz import _tar

from berth import config
from berth.errors import BerthError
from berth.image import stream
from berth.image.imageconfig import image_files, write_image_config
from berth.image.layers import apply_layer, new_root

_NAMES = ["a", "b", "a/b", "a/c", "b/a", "a/b/c", "l", "l/a", "etc", "etc/berth",
          "etc/berth/image.json", "./a", "a/", "."]
_TARGETS = ["a", "b", "a/b", "l", "/a", "../a", "etc", "x", "/etc"]
_KINDS = ["dir", "file", "file", "symlink", "hardlink", "fifo", "char", "whiteout", "opaque"]
_member = st.fixed_dictionaries({
    "kind": st.sampled_from(_KINDS),
    "name": st.sampled_from(_NAMES),
    "target": st.sampled_from(_TARGETS),
    "mode": st.sampled_from([0o755, 0o644, 0o700, 0o4755, 0o1777, 0, 0o2750]),
    "data": st.sampled_from([b"", b"one", b"two\n" * 3]),
    "mtime": st.just(1_000_000),
})
_IMAGE = {"env": ["PATH=/bin"], "entrypoint": None, "cmd": ["sh"], "workdir": "",
          "user": "", "source": "docker://test", "digest": "sha256:" + "0" * 64}


def _tree(root):
    """registry_fixture.tree, and the root's own mode."""
    return {".": stat.S_IMODE(os.lstat(root).st_mode), **tree(root)}


def _cfg(tmp):
    return config.load({"HOME": str(tmp), "ENROOT_SYSCONF_PATH": str(tmp),
                        "ENROOT_MAX_PROCESSORS": "1"})


def _unpacked(image, where):
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(where), str(image)], check=True,
                   stdout=subprocess.DEVNULL)
    return _tree(where)


def _written(stack, work):
    """The layers of `stack` (members each, bottom layer first) as tar files
    in `work`: (path, digest) each."""
    layers = []
    for number, members in enumerate(stack):
        path = work / f"layer{number}"
        path.write_bytes(_tar(members, outside="/nowhere"))
        layers.append((str(path), f"sha256:{number:064x}"))
    return layers


def _entry(kind, name, data=b"", target=""):
    return {"kind": kind, "name": name, "target": target, "mode": 0o755, "data": data,
            "mtime": 1_000_000}


def _applied(layers, root, files):
    new_root(root)
    try:
        for path, digest in layers:
            apply_layer(str(root), path, digest, "gzip")
        if files:
            write_image_config(str(root), _IMAGE)
    except (BerthError, OSError) as e:
        return e
    return _tree(root)


def _packed(layers, work, files):
    image = work / "packed.sqsh"
    try:
        stream.squash_layers(layers, str(image), _cfg(work),
                             files=image_files(_IMAGE) if files else ())
    except stream.NotStreamable as e:
        return e
    except BerthError as e:
        assert "\n" not in str(e)
        return e
    return _unpacked(image, work / "packed")


@settings(max_examples=800, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(stack=st.lists(st.lists(_member, max_size=8), min_size=1, max_size=4),
       files=st.booleans())
def test_the_packed_tree_is_the_applied_one(tmp_path_factory, stack, files):
    work = tmp_path_factory.mktemp("stream")
    layers = _written(stack, work)
    applied = _applied(layers, work / "applied", files)
    packed = _packed(layers, work, files)
    if isinstance(packed, stream.NotStreamable):
        event("declined")
        return
    if isinstance(applied, Exception):
        event("refused by both" if isinstance(packed, BerthError) else "applied refused")
        assert isinstance(packed, BerthError) or not isinstance(applied, BerthError), \
            (applied, packed)
        return
    event("packed")
    assert packed == applied


def test_a_hard_link_keeps_the_bytes_of_a_file_a_layer_above_replaced(tmp_path):
    """pip upgrading one of a package's hard-linked files: the link keeps
    the old bytes (os.link shared them) and the packed tree is the applied
    one, not declined (a realistic image has such links)."""
    stack = [[_entry("dir", "lib"), _entry("file", "lib/a.so", b"old"),
              _entry("hardlink", "lib/b.so", target="lib/a.so"),
              _entry("hardlink", "lib/c.so", target="lib/a.so"), _entry("file", "x", b"low")],
             [_entry("file", "lib/a.so", b"new")]]
    layers = _written(stack, tmp_path)
    packed = _packed(layers, tmp_path, files=True)
    assert packed == _applied(layers, tmp_path / "applied", files=True)
    assert (tmp_path / "packed/lib/b.so").read_bytes() == b"old"
    assert (tmp_path / "packed/lib/a.so").read_bytes() == b"new"
    assert os.path.samefile(tmp_path / "packed/lib/b.so", tmp_path / "packed/lib/c.so")


def test_a_file_between_two_directories_of_its_name_empties_the_lower_one(tmp_path):
    """A layer makes a directory a file, a layer above makes it a directory
    again: what the layers below had in it is gone (found by the random
    stacks above)."""
    stack = [[_entry("dir", "a/b")], [_entry("dir", "b"), _entry("file", "a")],
             [_entry("dir", "a")]]
    layers = _written(stack, tmp_path)
    packed = _packed(layers, tmp_path, files=False)
    assert packed == _applied(layers, tmp_path / "applied", files=False)
    assert "a/b" not in packed


_SIZES = [0, 1, 511, 512, 513, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, (1 << 20) + 3]


def _gzipped(path):
    path.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))


def test_files_of_every_size_come_through_whole(tmp_path):
    """A file's bytes copied or moved by the kernel (64 KiB and more),
    from a plain layer and a gzip one, and those a layer above replaced
    skipped: every file has its own bytes."""
    def data(size, seed):
        return random.Random(f"{seed}-{size}").randbytes(size)

    low = [_entry("file", f"d/{size}", data(size, "low")) for size in _SIZES]
    top = [_entry("file", f"d/{size}", data(size + 7, "top")) for size in _SIZES[::2]]
    top += [_entry("file", f"t/{size}", data(size, "top")) for size in _SIZES]
    layers = _written([low, top], tmp_path)
    _gzipped(tmp_path / "layer1")
    packed = _packed(layers, tmp_path, files=False)
    assert packed == _applied(layers, tmp_path / "applied", files=False)
    for index, size in enumerate(_SIZES):
        expected = data(size + 7, "top") if index % 2 == 0 else data(size, "low")
        assert (tmp_path / f"packed/d/{size}").read_bytes() == expected
        assert (tmp_path / f"packed/t/{size}").read_bytes() == data(size, "top")


def test_a_layer_cut_short_inside_a_file_is_refused_in_one_line(tmp_path):
    """A layer that ends inside a file's bytes (a large one the kernel
    moves, a small one copied), plain or gzip: the layer's error, in one
    line, and no image or temporary file left."""
    for size, compress in ((1 << 20, False), (1 << 20, True), (3000, False)):
        work = tmp_path / f"{size}-{compress}"
        work.mkdir()
        layers = _written([[_entry("file", "a", b"x" * 10), _entry("file", "b", b"y" * size)]],
                          work)
        path = work / "layer0"
        with tarfile.open(path) as archive:
            cut = archive.getmember("b").offset_data + size // 2
        path.write_bytes(path.read_bytes()[:cut])
        if compress:
            _gzipped(path)
        packed = _packed(layers, work, files=True)
        assert isinstance(packed, BerthError) and not isinstance(packed, stream.NotStreamable)
        assert "layer sha256:" in str(packed), packed
        assert sorted(os.listdir(work)) == ["layer0"]


def test_a_file_system_that_cannot_splice_has_the_bytes_copied(tmp_path, monkeypatch):
    """splice(2) refused (EINVAL: a plain layer's file system without it,
    mocked here, as every file system on this machine has it): the bytes
    go through Python, whole, and the import does not fail."""
    def refused(*_):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(stream.os, "splice", refused)
    big = random.Random(1).randbytes((1 << 20) + 5)
    layers = _written([[_entry("file", "big", big), _entry("file", "small", b"s")]], tmp_path)
    packed = _packed(layers, tmp_path, files=False)
    assert packed == _applied(layers, tmp_path / "applied", files=False)
    assert (tmp_path / "packed/big").read_bytes() == big
