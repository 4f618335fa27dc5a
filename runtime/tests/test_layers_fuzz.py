"""The layer unpacker against random tar streams (issue #11).

Members of every kind, named and linked with `..`, absolute paths,
symlinks out of the root (relative and to the host path of a directory
next to it), hard links, whiteouts, opaque markers, devices, FIFOs, paths
deeper than the limit, odd modes and times, streams cut short or with a
byte changed, plain and gzip. Whatever comes, nothing outside the root may
change and every failure must be a BerthError.
"""

import gzip
import io
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from berth.errors import BerthError
from berth.image.layers import MAX_DEPTH, apply_layer

# Placeholders: OUTSIDE becomes the host path of the directory next to the root.
OUTSIDE = "@outside@"
_PARTS = ["a", "b", "etc", "..", ".", "", "l", ".wh.a", ".wh.l", ".wh..wh..opq", "outside",
          "secret", "\u00e9", "x" * 300]
_TARGETS = ["a", "b/a", "..", "../..", "../outside", "../outside/secret", "/", "/etc",
            OUTSIDE, OUTSIDE + "/secret", "l", "l/a", "a/../../..", "", "x" * 5000]
_DEEP = [MAX_DEPTH - 2, MAX_DEPTH + 1, 1500]


def _name():
    inside = st.lists(st.sampled_from([p for p in _PARTS if p != ".."]), min_size=1,
                      max_size=5).map("/".join)
    anywhere = st.lists(st.sampled_from(_PARTS), min_size=1, max_size=5).map("/".join)
    deep = st.builds(lambda depth, leaf: "/".join(["d"] * depth + [leaf]),
                     st.sampled_from(_DEEP), st.sampled_from(["f", ".wh.f", ".wh..wh..opq"]))
    return st.one_of(
        inside, inside, inside, inside.map(lambda name: "./" + name),  # (most are fine)
        anywhere, anywhere.map(lambda name: "/" + name), st.just(OUTSIDE + "/secret"), deep)


_KINDS = ["dir", "file", "symlink", "hardlink", "char", "block", "fifo", "whiteout", "opaque"]
_member = st.fixed_dictionaries({
    "kind": st.sampled_from(_KINDS),
    "name": _name(),
    "target": st.one_of(st.sampled_from(_TARGETS), _name()),
    "mode": st.integers(0, 0o7777),
    "mtime": st.one_of(st.integers(-(2 ** 40), 2 ** 40), st.sampled_from([0, 2 ** 70]),
                       st.floats(allow_nan=True, allow_infinity=False)),
    "data": st.binary(max_size=64),
})
_layer = st.fixed_dictionaries({
    "members": st.lists(_member, max_size=12),
    "gzip": st.booleans(),
    # (mostly whole: a broken stream stops the layer at once)
    "cut": st.one_of(st.none(), st.none(), st.none(), st.integers(0, 4096)),
    "flip": st.one_of(st.none(), st.none(), st.none(), st.integers(0, 4096)),
})


def _tar(members, outside):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            name = member["name"].replace(OUTSIDE, outside)
            target = member["target"].replace(OUTSIDE, outside)
            kind = member["kind"]
            if kind == "whiteout":
                head, _, base = name.rpartition("/")
                name = f"{head}/.wh.{base}" if head else f".wh.{base}"
            elif kind == "opaque":
                name = name.rstrip("/") + "/.wh..wh..opq"
            info = tarfile.TarInfo(name)
            info.mode = member["mode"]
            info.mtime = member["mtime"]
            data = None
            if kind in ("file", "whiteout", "opaque"):
                data = member["data"] if kind == "file" else b""
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = target
            elif kind in ("char", "block"):
                info.type = tarfile.CHRTYPE if kind == "char" else tarfile.BLKTYPE
                info.devmajor, info.devminor = 1, 3
            else:
                info.type = tarfile.FIFOTYPE
            try:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
            except (ValueError, OverflowError, UnicodeError):
                pass  # (a header tarfile itself cannot write: not the unpacker's problem)
    return out.getvalue()


def _snapshot(top, skip):
    """Every path under `top` but `skip`: type, mode, size, times, content or target."""
    seen = {}
    for directory, dirs, files in os.walk(top):
        if directory == skip or directory.startswith(skip + os.sep):
            continue
        for name in dirs + files:
            path = os.path.join(directory, name)
            if path == skip:
                continue
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    extra = f.read()
            elif stat.S_ISLNK(info.st_mode):
                extra = os.readlink(path)
            else:
                extra = None
            seen[path] = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_nlink, extra)
    seen[top] = os.lstat(top).st_mode, os.lstat(top).st_mtime_ns
    return seen


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layers=st.lists(_layer, min_size=1, max_size=2))
def test_random_layers_change_nothing_outside_the_root(layers):
    base = tempfile.mkdtemp(prefix="berth-fuzz-")
    files = tempfile.mkdtemp(prefix="berth-fuzz-layers-")  # not in base: its times count
    try:
        outside = os.path.join(base, "outside")
        os.makedirs(os.path.join(outside, "dir"))
        with open(os.path.join(outside, "secret"), "w") as f:
            f.write("keep")
        os.symlink("secret", os.path.join(outside, "link"))
        root = os.path.join(base, "root")
        os.mkdir(root)
        before = _snapshot(base, root)
        for number, layer in enumerate(layers):
            data = _tar(layer["members"], outside)
            if layer["gzip"]:
                data = gzip.compress(data, mtime=0)
            if layer["cut"] is not None:
                data = data[:layer["cut"]]
            if layer["flip"] is not None and layer["flip"] < len(data):
                data = bytearray(data)
                data[layer["flip"]] ^= 0x5A
                data = bytes(data)
            path = os.path.join(files, f"layer{number}")
            with open(path, "wb") as f:
                f.write(data)
            try:
                apply_layer(root, path, f"sha256:{number:064x}", "gzip")
                event("applied")
            except BerthError as e:
                assert "\n" not in str(e)
                event("refused: " + re.sub(r"sha256:[0-9a-f]{64}|'[^']*'", "", str(e))[:50])
            os.unlink(path)
        assert _snapshot(base, root) == before
    finally:
        shutil.rmtree(base)
        shutil.rmtree(files)
