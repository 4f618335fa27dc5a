"""Images kept as parts (berth/image/parts.py): a new tag that shares the
lower layers of a cached image unpacks and squashes only its own layers,
and shows exactly what a whole import of it shows. Real registry, real
namespaces, kernel overlay, squashfuse and mksquashfs, run as the test
user (test_container's fixtures), as test_start_uri.py does.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from registry_fixture import (
    FORGED_DIGEST,
    forged_listing_line,
    forged_part,
    gzipped,
    layer_tar,
    listing,
    tree,
)
from test_start_uri import HOST_ARCH, busybox_layer, detached, pulling, registry, uri_of  # noqa: F401 (fixtures)

from berth.image import parts

CONFIG = {"architecture": HOST_ARCH, "os": "linux",
          "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}}

# The layer every tag shares above busybox's: what the new tops act on.
SHARED = layer_tar(
    ("dir", "data", 0o755), ("file", "data/keep", b"keep\n"), ("file", "data/gone", b"x\n"),
    ("dir", "data/sub", 0o755), ("file", "data/sub/old", b"old\n"),
    ("dir", "opq", 0o755), ("file", "opq/old1", b"1\n"), ("file", "opq/old2", b"2\n"),
    ("symlink", "lnk", "data"), ("file", "replace_me", b"file\n"),
    ("dir", "dir_to_file", 0o755), ("file", "dir_to_file/child", b"c\n"),
    ("file", "hard_src", b"shared bytes\n"), ("dir", "tmp", 0o1777),
    ("file", "data/odd\nname", b"odd\n"), ("file", "data/keep too", b"kept\n"))

# A top layer doing everything a layer may do to what lies below it.
HOSTILE_TOP = layer_tar(
    ("dir", "data", 0o750), ("file", "data/.wh.gone", b""),
    ("file", "data/.wh.sub", b""), ("dir", "data/sub", 0o700), ("file", "data/sub/new", b"n\n"),
    ("dir", "opq", 0o755), ("file", "opq/.wh..wh..opq", b""), ("file", "opq/new", b"new\n"),
    ("file", "lnk/through", b"through the link\n"), ("hardlink", "hard_copy", "hard_src"),
    ("dir", "replace_me", 0o755), ("file", "replace_me/inside", b"in\n"),
    ("file", "dir_to_file", b"now a file\n"), ("file", "tmp/new", b"t\n"),
    ("file", "data/.wh.odd\nname", b""), ("file", "data/new\nline", b"nl\n"))


@pytest.fixture(scope="module")
def lower_layers():
    """The lower layers every tag shares (busybox's, SHARED), made once:
    busybox's layer holds the times it was made at."""
    return [busybox_layer(), gzipped(SHARED)]


@pytest.fixture(scope="module")
def tags(registry, lower_layers):
    """test/app: v1 (busybox, SHARED, a plain top), v2 (the same two, the
    hostile top), v3 (a top writing a part's name at the root), v4 (another
    plain top)."""
    lower = lower_layers
    tops = {"v1": layer_tar(("file", "v1", b"1\n")), "v2": HOSTILE_TOP,
            "v3": layer_tar(("dir", ".berth-top.1", 0o755), ("file", ".berth-top.1/x", b"x\n")),
            "v4": layer_tar(("file", "v4", b"4\n"))}
    return {tag: registry.push_image("test/app", tag, [*lower, gzipped(top)], CONFIG)
            for tag, top in tops.items()}


def cache_import(berth, uri, *flags):
    result = berth("import", "--cache-only", *flags, uri)
    assert result.returncode == 0, result.stderr
    return result


def top_parts(image):
    listing = subprocess.run(["unsquashfs", "-l", "-max-depth", "1", str(image)],
                             capture_output=True, text=True, check=True).stdout
    return sorted(line.split("/", 1)[1] for line in listing.splitlines()
                  if line.startswith("squashfs-root/.berth-top."))


def test_a_new_tag_unpacks_only_its_own_layers_and_shows_what_a_whole_import_shows(
        pulling, proxy, tags):
    berth = pulling
    first = cache_import(berth, uri_of(proxy, "test/app:v1")).stdout.strip()
    assert top_parts(first) == [".berth-top.1"]
    proxy.requests.clear()
    second = cache_import(berth, uri_of(proxy, "test/app:v2"))
    assert "2 of 3 layers are in" in second.stderr, second.stderr
    # one layer fetched, the top part appended to a copy of the first tag's file
    assert len(proxy.blob_requests()) == 2  # the new layer and the image config
    entry = second.stdout.strip()
    assert top_parts(entry) == [".berth-top.1", ".berth-top.2"]

    # the same image imported whole (`import -o`: a plain squashfs)
    flat = berth.base / "flat.sqsh"
    berth.ok("import", "-o", flat, uri_of(proxy, "test/app:v2"))
    assert top_parts(flat) == []
    subprocess.run(["unsquashfs", "-no-progress", "-no-xattrs", "-no-exit-code", "-d",
                    str(berth.base / "flat"), str(flat)], check=True, capture_output=True)
    # created from the parted entry: its merged tree (parts.unpack)
    berth.ok("create", "-n", "parted", entry)
    expected = tree(berth.base / "flat")
    assert tree(berth.base / "data/parted") == expected
    assert "data/gone" not in expected and "opq/old1" not in expected
    assert "data/odd\nname" not in expected and "data/new\nline" in expected
    assert "data/sub/old" not in expected and "data/through" in expected

    # started: the parts stacked by the kernel's overlay show the same
    script = ("ls -A / /data /data/sub /opq /replace_me; cat /dir_to_file /hard_copy; "
              "stat -c %a /data /data/sub /tmp")
    started = berth("start", entry, "sh", "-c", script)
    whole = berth("start", flat, "sh", "-c", script)
    assert started.returncode == 0, started.stderr
    assert started.stdout == whole.stdout
    assert ".berth-top" not in started.stdout
    assert "now a file\nshared bytes\n750\n700\n1777\n" in started.stdout


def test_the_digest_and_source_are_read_from_the_top_part(pulling, proxy, tags):
    berth = pulling
    cache_import(berth, uri_of(proxy, "test/app:v1"))
    result = cache_import(berth, uri_of(proxy, "test/app:v2"), "--digest")
    entry, digest = result.stdout.split()
    assert top_parts(entry) == [".berth-top.1", ".berth-top.2"]
    assert digest == tags["v2"]


def test_a_layer_writing_a_parts_name_is_imported_whole(pulling, proxy, tags):
    berth = pulling
    cache_import(berth, uri_of(proxy, "test/app:v1"))
    result = cache_import(berth, uri_of(proxy, "test/app:v3"))
    assert "importing" in result.stderr and "whole, not as parts" in result.stderr
    entry = result.stdout.strip()
    assert top_parts(entry) == [".berth-top.1"]  # the image's own directory, nothing else
    shown = berth("start", entry, "cat", "/.berth-top.1/x")
    assert shown.returncode == 0 and shown.stdout == "x\n", shown.stderr


def test_each_entry_stands_alone_when_the_one_it_was_made_from_is_pruned(pulling, proxy, tags):
    berth = pulling
    first = cache_import(berth, uri_of(proxy, "test/app:v1")).stdout.strip()
    second = cache_import(berth, uri_of(proxy, "test/app:v2")).stdout.strip()
    os.utime(first, (1, 1))
    pruned = berth("cache", "prune", "--older-than", "1d")
    assert pruned.returncode == 0, pruned.stderr
    assert not os.path.exists(first) and os.path.exists(second)
    shown = berth("start", second, "cat", "/data/through", "/data/keep")
    assert shown.stdout == "through the link\nkeep\n", shown.stderr
    # the record of the layers now names the newer entry: a third tag builds on it
    third = cache_import(berth, uri_of(proxy, "test/app:v1"))
    assert "2 of 3 layers are in" in third.stderr and second in third.stderr


def test_a_third_tag_builds_on_the_newest_entry_and_quiet_says_nothing(pulling, proxy, tags):
    berth = pulling
    cache_import(berth, uri_of(proxy, "test/app:v1"))
    cache_import(berth, uri_of(proxy, "test/app:v2"))
    third = berth("--quiet", "import", "--cache-only", uri_of(proxy, "test/app:v4"))
    assert third.returncode == 0 and third.stderr == "", third.stderr
    entry = third.stdout.strip()
    # a copy of the second tag's entry, whose hostile part stays unused, and a part of its own
    assert top_parts(entry) == [".berth-top.1", ".berth-top.2", ".berth-top.3"]
    shown = berth("start", entry, "sh", "-c", "cat /v4 /data/gone; ls /opq; test ! -e /v1")
    assert shown.returncode == 0 and shown.stdout == "4\nx\nold1\nold2\n", shown.stderr


# -- what an image's layers hold never makes a part (nor what Berth reports) --

@pytest.fixture(scope="module")
def forging(registry, lower_layers):
    """test/forge: images whose lower layers carry directories posing as
    parts, each with a plain top layer of its own (/top)."""
    top = gzipped(layer_tar(("file", "top", b"top\n")))
    lowers = {
        # the shape that forged the digest: a lower layer, the marker a plain file
        "nine": [*lower_layers, gzipped(layer_tar(*forged_part(9)))],
        # the marker a device 0/0 (a layer's devices are skipped), named as part 1
        "one": [lower_layers[0], gzipped(layer_tar(*forged_part(1, marker="device"),
                                                   *forged_part(8)))],
        # the marker a symbolic link whose target forges the listing's line
        "link": [*lower_layers, gzipped(layer_tar(*forged_part(9, marker="link")))],
        # several such links, parts 1 and 2, in the image's one layer below its top
        "links": [lower_layers[0], gzipped(layer_tar(*forged_part(1, marker="link"),
                                                     *forged_part(2, marker="link")))],
    }
    return {tag: registry.push_image("test/forge", tag, [*lower, top], CONFIG)
            for tag, lower in lowers.items()}


@pytest.mark.parametrize("tag", ["nine", "one", "link", "links"])
@pytest.mark.parametrize("sibling", [False, True], ids=["alone", "after-a-sibling-tag"])
def test_no_layer_can_choose_the_digest_berth_reports(pulling, proxy, tags, forging, tag,
                                                     sibling):
    berth = pulling
    if sibling:  # test/app:v1 shares the lower layers of test/forge:nine
        cache_import(berth, uri_of(proxy, "test/app:v1"))
    uri = uri_of(proxy, f"test/forge:{tag}")
    result = cache_import(berth, uri, "--digest")
    assert "whole, not as parts" in result.stderr and "touches /.berth-top." in result.stderr
    entry, digest = result.stdout.split()
    assert digest == forging[tag] != FORGED_DIGEST
    assert not parts.top_of_file(entry)  # a plain entry: the directories are the image's
    process, said, _ = detached(berth, "--reuse", uri)
    process.stdin.close()
    assert said == f"{forging[tag]} cached\n" and process.wait(timeout=30) == 0
    # it runs with exactly what its layers hold, the posing directories included
    part = ".berth-top.1" if tag in ("one", "links") else ".berth-top.9"
    shown = berth("start", entry, "sh", "-c", f"cat /top /{part}/seen; "
                  f"grep -c {FORGED_DIGEST} /{part}/etc/berth/image.json; "
                  "grep -c nvcr /etc/berth/image.json || true")
    assert shown.returncode == 0 and shown.stdout == "top\nseen\n1\n0\n", shown.stderr
    berth.ok("create", "-n", "forged", entry)
    assert (berth.base / "data/forged/top").read_text() == "top\n"


TOUCHING_TOPS = {
    "file": layer_tar(("file", ".berth-top.1", b"mine\n")),
    "whiteout": layer_tar(("file", ".wh..berth-top.1", b""), ("file", ".wh..berth-top.2", b""),
                          ("file", "after", b"after\n")),
    "symlink": layer_tar(("symlink", "to_part", ".berth-top.1"),
                         ("file", "to_part/x", b"x\n")),
    "opaque": layer_tar(("file", ".wh..wh..opq", b""), ("file", "only", b"only\n")),
    "link": layer_tar(*forged_part(9, marker="link")),
}


@pytest.fixture(scope="module")
def touching(registry, lower_layers):
    """test/app tags of the shared lower layers whose top layer touches a
    part's name at the root (TOUCHING_TOPS)."""
    return {kind: registry.push_image("test/app", f"touch-{kind}", [*lower_layers, gzipped(top)],
                                      CONFIG)
            for kind, top in TOUCHING_TOPS.items()}


@pytest.mark.parametrize("kind", sorted(TOUCHING_TOPS))
def test_a_new_tag_touching_a_parts_name_is_imported_whole(pulling, proxy, tags, touching, kind):
    berth = pulling
    cache_import(berth, uri_of(proxy, "test/app:v1"))
    result = cache_import(berth, uri_of(proxy, f"test/app:touch-{kind}"), "--digest")
    assert "whole, not as parts" in result.stderr and "touches /.berth-top." in result.stderr
    entry, digest = result.stdout.split()
    assert "2 of 3 layers are in" in result.stderr  # (its base was found first)
    assert digest == touching[kind] and not parts.top_of_file(entry)
    if kind == "opaque":  # nothing of the lower layers is left to run: its tree says it
        shown = listing(entry).split()
        assert "/only" in shown and "/bin" not in shown and "/data" not in shown, shown
        return
    script = {"file": "cat /.berth-top.1", "whiteout": "cat /after /data/keep",
              "symlink": "cat /to_part/x /.berth-top.1/x", "link": "cat /.berth-top.9/seen"}[kind]
    shown = berth("start", entry, "sh", "-c", script)
    expected = {"file": "mine\n", "whiteout": "after\nkeep\n", "symlink": "x\nx\n",
                "link": "seen\n"}[kind]
    assert shown.returncode == 0 and shown.stdout == expected, shown.stderr


def test_a_part_is_a_directory_holding_its_own_whiteout_whatever_else_is_named_so(tmp_path):
    """The one definition every reader uses (parts._is_part): names and
    plain files, newlines in names that would forge a listing's line
    included, never make a part."""
    root = tmp_path / "root"
    forged = root / ".berth-top.5" / "a\ncrw-r--r-- root/root 0,  0 2026-01-01 00:00 squashfs-root"
    (forged / ".berth-top.5").mkdir(parents=True)
    (forged / ".berth-top.5/.berth-top.5").write_text("")
    (root / ".berth-top.5/.berth-top.5").write_text("")
    (root / ".berth-top.1").mkdir()
    (root / ".berth-top.7").mkdir()  # a link's target forging the marker's line
    (root / ".berth-top.7/.berth-top.7").symlink_to(forged_listing_line(".berth-top.7"))
    image = tmp_path / "image.sqsh"
    subprocess.run(["mksquashfs", root, image, "-quiet", "-no-progress", "-p",
                    ".berth-top.1/.berth-top.1 c 0000 0 0 0 0"], check=True)
    assert parts.top_of_file(str(image)) == ".berth-top.1"
    (root / ".berth-top.1/.berth-top.1").write_text("")  # a plain file: no part at all
    subprocess.run(["mksquashfs", root, image, "-quiet", "-no-progress", "-noappend"],
                   check=True)
    assert parts.top_of_file(str(image)) is None


def test_a_base_whose_root_holds_names_of_the_image_posing_as_parts_is_not_built_on(tmp_path):
    """An entry made before layers were guarded: its own `.berth-top.*`
    names would be hidden or renamed by the next part."""
    lower = tmp_path / "lower"
    (lower / ".berth-top.1").mkdir(parents=True)
    os.mknod(lower / ".berth-top.1/.berth-top.1", stat.S_IFCHR | 0o600, 0)
    parts.check_lower(str(lower), 2)  # a part below the new one: fine
    with pytest.raises(parts.Unavailable, match="/.berth-top.1 at its root"):
        parts.check_lower(str(lower), 1)
    (lower / ".berth-top.3").mkdir()
    with pytest.raises(parts.Unavailable, match="/.berth-top.3 at its root"):
        parts.check_lower(str(lower), 2)


@pytest.mark.parametrize("lowers, upper", [("{t}/a,b:{t}/c", None), ("{t}/a:{t}/b\\c", None),
                                           ("{t}/a", "{t}/co:lon,x=y")])
def test_an_overlays_directory_that_would_split_its_options_is_refused(tmp_path, lowers, upper):
    """A ',' in a directory ends overlay's option there, a ':' a lower
    directory: refused before any mount (the import goes whole)."""
    def never(merged):
        raise AssertionError("applied")
    t = str(tmp_path)
    with pytest.raises(parts.Unavailable, match="a path with ',', ':' or '.' cannot be an "
                                                "overlay's directory"):
        parts.apply_over(lowers.format(t=t), f"{t}/merged", never,
                         upper=upper and upper.format(t=t), work=f"{t}/work")
