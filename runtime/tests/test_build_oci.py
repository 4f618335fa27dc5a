"""`berth build -o oci:DIR` and `-o oci-archive:FILE`, end to end as an
unprivileged user: the layout is read by a second tool (skopeo, which
checks every blob's digest as it copies), pushed by it to the real
registry of registry_fixture.py, and pulled back by `berth import`, which
applies the layers' whiteouts and opaque directories; what starts holds
the files `-o OUT.sqsh` holds. Refused outputs are one line and leave
nothing behind."""

import hashlib
import json
import os
import stat
import subprocess
import tarfile

from test_build import build, built, write  # noqa: F401 (build: a fixture)
from test_start_uri import registry  # noqa: F401 (a fixture: test/busybox:v1 pushed)

# Each kind of change a layer carries: new files, an edit, a removal from
# the base, a directory replaced (an opaque one), a hard link, a symlink,
# names a tar header cannot hold (a newline, not UTF-8, 150 bytes).
CHANGES = """\
FROM ./base.sqsh AS first
RUN mkdir -p /out && echo made > /out/made
FROM ./base.sqsh
RUN mkdir -p /swap/old && echo x > /swap/old/f && echo gone > /gone && echo one > /edited
RUN mkdir /new && echo fresh > /new/fresh && rm -rf /swap /gone && mv /new /swap \\
 && echo two > /edited && ln /edited /hard && ln -s edited /soft
COPY --from=first /out/made /copied
RUN mkdir /names && cd /names && touch "$(printf 'new\\nline')" "$(printf 'not\\377utf8')" \\
 "$(printf '%0150d' 0)" && ln -s "/$(printf '%0200d' 1)" long-link
ENV GREETING=hello
WORKDIR /made/late
CMD ["cat", "/swap/fresh"]
"""


def _tree(image, target):
    """`image` (a squashfs) unpacked: each path's type, mode, link and bytes."""
    subprocess.run(["unsquashfs", "-no-progress", "-d", target, image], check=True,
                   capture_output=True)
    found = {}
    for top, dirs, files in os.walk(target):
        for name in dirs + files:
            path = os.path.join(top, name)
            info = os.lstat(path)
            what = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
            if stat.S_ISLNK(info.st_mode):
                what += (os.readlink(path),)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    what += (hashlib.sha256(f.read()).hexdigest(),)
            found[os.path.relpath(path, target)] = what
    # (each image's own: the record names its source, so its rc's comment does)
    record = json.loads((target / "etc/berth/image.json").read_text())
    rc = (target / "etc/rc").read_text().splitlines()
    found["etc/berth/image.json"] = {key: record[key] for key in
                                     ("env", "entrypoint", "cmd", "workdir", "user")}
    found["etc/rc"] = [line for line in rc if not line.startswith("# Written by")]
    return found


def _skopeo(*args):
    result = subprocess.run(["skopeo", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_an_oci_layout_is_pushed_by_skopeo_and_imports_as_the_squashfs(berth, build, registry,
                                                                        tmp_path):
    write(berth, build, CHANGES)
    built(berth, "-o", "out.sqsh", build)
    assert built(berth, "-o", "oci:layout", build)[:2] == (0, 5)  # every step from the cache
    layout = berth.base / "layout"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    config = json.loads(_skopeo("inspect", "--config", f"oci:{layout}"))
    assert config["os"] == "linux" and len(config["rootfs"]["diff_ids"]) == 6
    assert [h.get("empty_layer", False) for h in config["history"]] == [
        False, False, False, False, False, True, True, True, False]
    assert config["history"][1]["created_by"].startswith("RUN mkdir -p /swap/old")
    assert config["config"]["Cmd"] == ["cat", "/swap/fresh"]
    assert config["config"]["WorkingDir"] == "/made/late"
    assert "GREETING=hello" in config["config"]["Env"]
    _skopeo("copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}",
            f"docker://{registry.host}/test/built:v1")
    berth.env.update(ENROOT_ALLOW_HTTP="yes")
    berth.ok("import", "-o", "pulled.sqsh", f"docker://{registry.host}#test/built:v1")
    pulled = berth.base / "pulled.sqsh"
    assert _tree(pulled, tmp_path / "pulled") == _tree(berth.base / "out.sqsh", tmp_path / "out")
    assert sorted(os.listdir(os.fsencode(tmp_path / "pulled/names"))) == [
        b"0" * 150, b"long-link", b"new\nline", b"not\377utf8"]
    assert berth.ok("start", pulled) == "fresh\n"
    assert berth.ok("start", pulled, "pwd") == "/made/late\n"  # (made by no step)
    assert berth.ok("start", pulled, "sh", "-c", "ls / ; cat /edited /hard /soft /copied") \
        .count("gone") == 0


def test_an_oci_archive_holds_the_same_image_as_the_layout(berth, build):
    """The same build to both outputs: the same manifest, so the same
    digests (the tar and its gzip are deterministic)."""
    write(berth, build, CHANGES)
    built(berth, "-o", "oci:layout", build)
    built(berth, "-o", "oci-archive:image.tar", build)
    index = json.loads((berth.base / "layout/index.json").read_text())
    manifest = _skopeo("inspect", "--raw", f"oci-archive:{berth.base / 'image.tar'}")
    assert "sha256:" + hashlib.sha256(manifest.encode()).hexdigest() == \
        index["manifests"][0]["digest"]
    # the layers are the cache's (the first stage's too), and nothing the
    # cache would count as partial
    cache = berth.base / "cache"
    assert all(name.endswith(".sqsh") for name in os.listdir(cache / "images"))
    blobs = set(os.listdir(cache / "blobs/sha256"))
    # (7 steps' tars, the first stage's too, and the gzips of the image's 6)
    assert len(blobs) == 13 and all(len(name) == 64 for name in blobs)
    assert blobs > set(os.listdir(berth.base / "layout/blobs/sha256")) - {
        index["manifests"][0]["digest"].split(":")[1],
        json.loads(manifest)["config"]["digest"].split(":")[1]}


def test_a_refused_output_is_one_line_and_runs_no_step(berth, build):
    write(berth, build, CHANGES)
    (berth.base / "full").mkdir()
    (berth.base / "full/kept").write_text("mine\n")
    locked = berth.base / "locked"
    locked.mkdir(mode=0o555)
    berth.chown(berth.base / "full", locked)
    for spec, said in [("oci:full", "oci:full: exists and is not an empty directory"),
                       (f"oci:{locked}/x", f"oci:{locked}/x: {locked} is not writable"),
                       (f"oci-archive:{locked}/x.tar",
                        f"oci-archive:{locked}/x.tar: {locked} is not writable"),
                       (f"{locked}/x.sqsh", f"{locked}/x.sqsh: {locked} is not writable")]:
        result = berth("build", "-o", spec, build)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [f"berth: error: {said}"]
    assert os.listdir(berth.base / "full") == ["kept"] and os.listdir(locked) == []
    assert not (berth.base / "cache/images").exists()  # no step ran


def test_a_layout_that_does_not_fit_leaves_nothing(berth, build):
    """A real full filesystem (a 64 KiB tmpfs) under the output: the write
    fails in one line naming the output, and no partial layout or archive
    stays; the steps stay cached."""
    write(berth, build, CHANGES)
    small = berth.base / "small"
    small.mkdir()
    user = berth.user
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64k,uid={user.pw_uid},"
                    f"gid={user.pw_gid},mode=0755", "hoci-small", small], check=True)
    try:
        for spec in (f"oci:{small}/layout", f"oci-archive:{small}/image.tar"):
            result = berth("build", "-q", "-o", spec, build)
            assert result.returncode == 1
            assert result.stderr.strip().splitlines() == [
                f"berth: error: {spec}: No space left on device"]
            assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", small], check=True)


OWNED = """\
FROM ./base.sqsh
RUN echo 'app:x:1000:1001::/:/bin/sh' >> /etc/passwd && echo 'staff:x:50:' > /etc/group
COPY --chown=app:staff tool.sh /opt/tools/
RUN echo '# edited' >> /opt/tools/tool.sh && touch /opt/tools/new{}
"""


def _layer_owners(layout):
    """[{path: 'uid:gid'}] of each layer of the layout's image."""
    def blob(digest):
        return layout / "blobs/sha256" / digest.removeprefix("sha256:")

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    found = []
    for layer in manifest["layers"]:
        with tarfile.open(blob(layer["digest"])) as tar:
            found.append({m.name: f"{m.uid}:{m.gid}" for m in tar})
    return found


def test_chown_owners_reach_the_layers_and_survive_the_cache(berth, build):
    """COPY --chown's names come from the image's own passwd and group; the
    squashfs stays all root's, the layers keep the owner, and a RUN that
    runs after that COPY was taken from the cache (a changed last line)
    still writes the file it edits as the COPY's owner's."""
    write(berth, build, OWNED.format(""))
    built(berth, "-o", "out.sqsh", build)
    listing = subprocess.run(["unsquashfs", "-lln", berth.base / "out.sqsh", "opt/tools"],
                             capture_output=True, text=True, check=True).stdout
    assert " 0/0 " in listing and "1000/50" not in listing
    write(berth, build, OWNED.format(" && echo two"))
    assert built(berth, "-o", "oci:layout", build)[:2] == (1, 2)  # the COPY from the cache
    copied, edited = _layer_owners(berth.base / "layout")[2:4]
    assert copied == {"opt": "1000:50", "opt/tools": "1000:50", "opt/tools/tool.sh": "1000:50"}
    assert edited["opt/tools/tool.sh"] == "1000:50" and edited["opt/tools/new"] == "0:0"
