"""`berth build` held to Docker's BuildKit: each Containerfile of CASES is
built by both from the same busybox base, and what each build added,
changed or removed (path, type, mode, size, content digest, link target,
owner) and its image configuration are compared. BuildKit is the Docker
daemon's own (Debian's docker.io client with DOCKER_BUILDKIT=1; the
image is read back with `docker save` and `docker inspect`); berth runs as
root here, and its image is read with unsquashfs.

A case marked `oci` reads berth's image from `-o oci:` instead, its layers
applied as Docker's are: that image keeps the owners COPY --chown, a
stage and an archive give (the squashfs, asserted all root's, does not).
An HTTP server on 127.0.0.1 serves what ADD of a URL fetches, to both.

Where the two differ on purpose, DIFFERENCES holds what each side gives,
as docs/compatibility.md describes it: the test fails when either side
changes. Heredocs are left out: this daemon's BuildKit (v0.8) has none."""

import hashlib
import http.server
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = "/usr/bin/docker"  # (Debian's client: it talks to the daemon's BuildKit)
TAG = f"berth-bkdiff-{os.getpid()}"
BASE = "@BASE@"  # FROM's image: the base on each side
URL = "@URL@"  # the files server's http://127.0.0.1:PORT, which both sides reach
# berth's image record (config, compared as such) and the files it is
# also written as, the way enroot's images carry it
RECORD = ("etc/berth/image.json", "etc/environment", "etc/rc")
# the base's configuration, as both sides read it: every case changes it or the tree
BASE_CONFIG = {"Env": ["PATH=/usr/local/bin:/bin"], "Cmd": ["/bin/sh"], "Entrypoint": None,
               "WorkingDir": "", "User": "", "Labels": {}, "ExposedPorts": [], "Volumes": [],
               "StopSignal": "", "Shell": None}


class Case(typing.NamedTuple):
    name: str
    text: str                     # the file after its head
    head: str = f"FROM {BASE}\n"  # the lines up to the first stage's first step
    args: tuple = ()              # --build-arg NAME=VALUE, to both
    oci: bool = False             # berth's image read from -o oci: (owners kept), not the squashfs


def _owned_tar():
    """A tar whose members name owners: 1234:567, and root's."""
    found = io.BytesIO()
    with tarfile.open(fileobj=found, mode="w") as tar:
        for name, owner in (("t", 1234), ("t/f", 1234), ("r", 0)):
            info = tarfile.TarInfo(name)
            info.uid, info.gid, info.mtime = owner, owner and 567, 1583229600
            data = b"" if name == "t" else f"{name}\n".encode()
            info.type, info.mode = (tarfile.DIRTYPE, 0o755) if not data else (tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return found.getvalue()


# the build context of every case (a trailing '/': an empty directory)
CONTEXT = {"a.txt": "a\n", "b.txt": "bb\n", "c.md": "c\n", "tool.sh": "#!/bin/sh\necho tool\n",
           "dir/x": "x\n", "dir/sub/y": "y\n", "dir/empty/": "", "owned.tar": _owned_tar()}

CASES = [
    Case("run-shell", "RUN echo one > /one && mkdir -p /made/deep"),
    Case("run-json", 'RUN ["/bin/sh", "-c", "echo json > /json"]'),
    Case("run-continuation", "RUN echo a \\\n    b \\\n # a comment inside\n    c > /cont"),
    Case("escape-directive", "RUN echo `\n  tick > /tick", head=f"# escape=`\nFROM {BASE}\n"),
    Case("rm-file", "RUN rm /bin/vi /etc/group"),
    Case("rm-dir", "RUN rm -r /usr/local"),
    Case("rm-then-make", "RUN rm -r /usr/local && mkdir -p /usr/local/new && echo n > /usr/local/f"),
    Case("chmod-chown-run", "RUN echo s > /s && chmod 4750 /s && chmod 700 /work"),
    Case("symlinks", "RUN ln -s /etc/passwd /pw && ln -s ../nowhere /dangling"),
    Case("copy-file", "COPY a.txt /"),
    Case("copy-rename", "COPY a.txt /renamed"),
    Case("copy-into-dir", "COPY a.txt b.txt /new/"),
    Case("copy-glob", "COPY *.txt /globbed/"),
    Case("copy-dir-contents", "COPY dir /d"),
    Case("copy-dir-slash", "COPY dir/ /d2/"),
    Case("copy-chmod", "COPY --chmod=750 tool.sh /usr/local/bin/"),
    Case("copy-chown-root", "COPY --chown=root:root a.txt /r1\nCOPY --chown=0 b.txt /r2"),
    Case("copy-chown-names", "COPY --chown=app a.txt /n1\nCOPY --chown=app:staff dir /n2/\n"
                             "COPY --chown=1234 a.txt /new/deep/\n"
                             "COPY --chown=nobody:0 b.txt /usr/local/bin/", oci=True),
    Case("copy-chown-then-run", "ARG WHO=app\nCOPY --chown=${WHO}:staff dir /d\n"
                                "RUN echo more >> /d/x && touch /d/new && rm /d/sub/y", oci=True),
    Case("copy-from-a-chowned-stage", "COPY --chown=app a.txt dir /owned/\nFROM @BASE@\n"
                                      "COPY --from=first /owned /b\n"
                                      "COPY --from=first /owned/a.txt /c", oci=True,
         head=f"FROM {BASE} AS first\n"),
    Case("copy-chown-from-stage", "RUN echo built > /artifact\nFROM @BASE@\n"
                                  "COPY --chown=app --from=0 /artifact /got\n"
                                  "COPY a.txt /got", oci=True),
    Case("copy-json-form", 'COPY ["a.txt", "/json dir/"]'),
    Case("workdir-relative", "WORKDIR /w\nWORKDIR sub\nCOPY a.txt .\nRUN pwd > here"),
    Case("workdir-made", "WORKDIR /never/used"),
    Case("env-forms", 'ENV ONE=1 TWO="two words" THREE=${ONE}x\nENV LEGACY the rest of it\n'
                      'RUN echo "$ONE $TWO $THREE $LEGACY" > /env'),
    Case("substitution-forms", "ARG SET=set\nARG EMPTY=\n"
                               "ENV A=${SET:-dflt} B=${EMPTY:-dflt} C=${SET:+alt} D=${EMPTY:+alt} "
                               "E=${UNSET:-x} F=\\$SET G=$SET"),
    Case("arg-before-from", "RUN echo ${V:-none} > /v", head=f"ARG V=global\nFROM {BASE}\n"),
    Case("arg-scoping", "ARG V\nRUN echo $V > /v\nENV W=$V", args=("V=given",)),
    Case("multi-stage", "RUN echo built > /artifact\nFROM @BASE@\nCOPY --from=0 /artifact /got"),
    Case("multi-stage-named", "RUN mkdir /out && echo o > /out/o\nFROM @BASE@ AS second\n"
                              "COPY --from=first /out /copied/\nFROM second\nRUN ls /copied > /list",
         head=f"FROM {BASE} AS first\n"),
    Case("user", "USER nobody"),
    Case("shell", 'SHELL ["/bin/sh", "-ec"]\nRUN echo $0 > /zero\nCMD exec sleep 1'),
    Case("label", 'LABEL a=1 "b c"="d e"\nLABEL a=2'),
    Case("cmd-shell", "CMD echo hi"),
    Case("entrypoint-cmd", 'ENTRYPOINT ["/bin/tool"]\nCMD ["x", "y"]'),
    Case("cmd-then-entrypoint", 'CMD ["x"]\nENTRYPOINT /bin/tool'),
    Case("entrypoint-resets-base-cmd", 'ENTRYPOINT ["/bin/tool"]'),
    Case("run-chown", "RUN touch /f && chown 65534:65534 /f"),
    Case("dir-modes", "RUN mkdir /ro /sticky && chmod 500 /ro && chmod 1777 /sticky"),
    Case("hardlink", "RUN echo h > /h1 && ln /h1 /h2"),
    Case("copy-from-stage-symlink", "FROM @BASE@\nCOPY --from=0 /bin/sh /bin/ls /links/"),
    Case("copy-merge-dir", "COPY dir /usr/local/"),
    Case("copy-from-image", "COPY --from=@BASE@ /bin/tool /etc/passwd /from-image/"),
    # (mount points the image has: berth removes one it made, BuildKit keeps it)
    Case("bind-from-image", "RUN --mount=type=bind,from=@BASE@,source=/etc,target=/work "
                            "cat /work/group > /mounted"),
    Case("cache-from-stage", "RUN mkdir /seed && echo seeded > /seed/f\nFROM @BASE@\n"
                             "RUN --mount=type=cache,target=/work,from=first,source=/seed "
                             "cat /work/f > /got",
         head=f"FROM {BASE} AS first\n"),
    Case("bind-from-stage", "RUN echo built > /artifact\nFROM @BASE@\n"
                            "RUN --mount=from=first,target=/work cp /work/artifact /got",
         head=f"FROM {BASE} AS first\n"),
    Case("add-plain-file", "ADD a.txt b.txt /added/"),
    Case("add-archive-owners", "ADD owned.tar /x/\nADD owned.tar /usr/local/", oci=True),
    Case("add-archive-chown", "ADD --chown=app owned.tar /y/", oci=True),
    Case("add-url", "ADD @URL@/files/tool.sh /opt/\nADD @URL@/files/dir/ /named\n"
                    "ADD @URL@/files/a%20b @URL@/files/c /multi/\n"
                    "ADD --chmod=755 @URL@/files/x /usr/local/bin/x"),
    Case("add-url-chown", "ADD --chown=app:staff @URL@/files/t /t\n"
                          "ADD --chown=1234 @URL@/files/u /new/dir/", oci=True),
    Case("variables-in-paths", "ENV D=/dest P=80\nWORKDIR $D/w\nCOPY a.txt ${D}/\n"
                               "EXPOSE $P\nVOLUME $D/vol\nUSER ${NOBODY:-nobody}"),
    Case("env-override-base", "ENV PATH=/opt/bin:$PATH\nARG A=1\nARG B=${A}2\nENV B=$B"),
    Case("expose-volume-stopsignal", "EXPOSE 80 53/udp 8080/tcp\nVOLUME /data\n"
                                     'VOLUME ["/v1", "/v2"]\nSTOPSIGNAL SIGINT'),
]


class Entry(typing.NamedTuple):
    kind: str    # file, dir, link (others: their stat name)
    mode: int    # the permission bits, setuid/setgid/sticky included
    size: int    # a file's (0 for the rest)
    digest: str  # a file's content's sha256
    target: str  # a link's
    owner: str   # uid:gid


def _base_tree(root):
    """The base both sides build on: busybox, its applets, a passwd with
    nobody, and berth's image record that says what the Docker base says."""
    for d in ("bin", "etc/berth", "proc", "dev", "sys", "tmp", "work", "usr/local/bin", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox")
    shutil.copy(busybox, root / "bin/busybox")
    for applet in subprocess.run([busybox, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split():
        if not (root / "bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    (root / "bin/tool").write_text('#!/bin/sh\necho "tool $*"\n')
    (root / "bin/tool").chmod(0o755)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                     "nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
                                     "app:x:1000:1001:app:/home/app:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\nappgrp:x:1001:\nstaff:x:50:\n")
    sys.path.insert(0, str(REPO / "runtime"))
    try:
        from berth.image import imageconfig
        imageconfig.write_image_config(str(root), {
            "env": ["PATH=/usr/local/bin:/bin"], "entrypoint": None, "cmd": ["/bin/sh"],
            "workdir": "", "user": "", "source": "test", "digest": "", "shell": None})
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(the base's tree, its entries, the Docker image's name, base.sqsh)."""
    top = tmp_path_factory.mktemp("bkdiff")
    root = top / "root"
    _base_tree(root)
    packed = subprocess.run(["tar", "-C", str(root), "--numeric-owner", "--owner=0", "--group=0",
                             "-c", "."], capture_output=True, check=True).stdout
    subprocess.run([DOCKER, "import", "-c", "ENV PATH=/usr/local/bin:/bin", "-c",
                    'CMD ["/bin/sh"]', "-", f"{TAG}-base"], input=packed, check=True,
                   capture_output=True)
    subprocess.run(["mksquashfs", str(root), str(top / "base.sqsh"), "-noappend", "-all-root",
                    "-quiet", "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    yield _walk(root), f"{TAG}-base", top / "base.sqsh"
    subprocess.run([DOCKER, "rmi", "-f", f"{TAG}-base"], capture_output=True, check=False)


def _walk(root):
    """{path: Entry} of a directory tree (its top left out)."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            info = os.lstat(path)
            kind = {stat.S_IFREG: "file", stat.S_IFDIR: "dir",
                    stat.S_IFLNK: "link"}.get(stat.S_IFMT(info.st_mode), str(info.st_mode))
            digest, size = "", 0
            if kind == "file":
                with open(path, "rb") as f:
                    digest, size = hashlib.sha256(f.read()).hexdigest(), info.st_size
            found[os.path.relpath(path, root)] = Entry(
                kind=kind, mode=stat.S_IMODE(info.st_mode), size=size, digest=digest,
                target=os.readlink(path) if kind == "link" else "",
                owner=f"{info.st_uid}:{info.st_gid}")
    return found


def _tar_entry(layer, member, found):
    if member.islnk():  # (a hard link: the file it links, as a walk sees it)
        return found[os.path.normpath(member.linkname.lstrip("./"))]
    if member.isfile():
        data = layer.extractfile(member).read()
        return Entry("file", stat.S_IMODE(member.mode), len(data), hashlib.sha256(data).hexdigest(), "",
                     f"{member.uid}:{member.gid}")
    kind = "dir" if member.isdir() else "link" if member.issym() else str(member.type)
    return Entry(kind, stat.S_IMODE(member.mode), 0, "", member.linkname if member.issym() else "",
                 f"{member.uid}:{member.gid}")


def _apply(found, layer):
    """One layer of `docker save` on the {path: Entry} below it, whiteouts included."""
    for member in layer.getmembers():
        path = os.path.normpath(member.name.lstrip("./") or ".")
        parent, name = os.path.split(path)
        if path == ".":
            continue
        if name == ".wh..wh..opq":
            for gone in [p for p in found if p.startswith(parent + "/")]:
                del found[gone]
        elif name.startswith(".wh."):
            gone = os.path.join(parent, name[4:])
            for p in [p for p in found if p == gone or p.startswith(gone + "/")]:
                del found[p]
        else:
            found[path] = _tar_entry(layer, member, found)


def _docker_build(context, tag, build_args):
    flags = [f"--build-arg={arg}" for arg in build_args]
    result = subprocess.run([DOCKER, "build", "--progress=plain", "-t", tag, *flags,
                             str(context)], capture_output=True, text=True, check=False,
                            env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = tarfile.open(fileobj=io.BytesIO(subprocess.run(
        [DOCKER, "save", tag], capture_output=True, check=True).stdout))
    found = {}
    for name in json.load(saved.extractfile("manifest.json"))[0]["Layers"]:
        with tarfile.open(fileobj=saved.extractfile(name)) as layer:
            _apply(found, layer)
    c = json.loads(subprocess.run([DOCKER, "inspect", "-f", "{{json .Config}}", tag],
                                  capture_output=True, check=True, text=True).stdout)
    return found, {"Env": c["Env"], "Cmd": c["Cmd"], "Entrypoint": c["Entrypoint"],
                   "WorkingDir": c["WorkingDir"], "User": c["User"],
                   "Labels": c.get("Labels") or {},
                   "ExposedPorts": sorted(c.get("ExposedPorts") or {}),
                   "Volumes": sorted(c.get("Volumes") or {}),
                   "StopSignal": c.get("StopSignal", ""), "Shell": c.get("Shell")}


def _run_berth(context, top, build_args, output="out.sqsh"):
    dirs = {f"ENROOT_{name}_PATH": str(top / name.lower())
            for name in ("CACHE", "TEMP", "DATA", "RUNTIME", "CONFIG", "SYSCONF")}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    flags = [f"--build-arg={arg}" for arg in build_args]
    return subprocess.run([sys.executable, "-m", "berth.cli", "build", "-q", "-o", output,
                           *flags, str(context)], cwd=top, capture_output=True, text=True,
                          check=False, timeout=120,
                          env={**os.environ, **dirs, "PYTHONPATH": str(REPO / "runtime")})


def _oci_tree(layout):
    """{path: Entry} of the OCI layout `layout`'s image, its layers applied."""
    def blob(digest):
        return layout / "blobs/sha256" / digest.removeprefix("sha256:")

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    found = {}
    for layer in manifest["layers"]:
        with tarfile.open(blob(layer["digest"])) as tar:
            _apply(found, tar)
    return found


def _berth_build(context, top, build_args, oci=False):
    result = _run_berth(context, top, build_args)
    assert result.returncode == 0, result.stderr[-2000:]
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(top / "tree"), str(top / "out.sqsh")],
                   check=True, stdout=subprocess.DEVNULL)
    found = _walk(top / "tree")
    if oci:  # (every step from the cache: the same build, written as layers)
        result = _run_berth(context, top, build_args, output="oci:oci")
        assert result.returncode == 0, result.stderr[-2000:]
        assert {e.owner for e in found.values()} == {"0:0"}  # the squashfs: all root's
        found = _oci_tree(top / "oci")
    r = json.loads((top / "tree" / RECORD[0]).read_text())
    return found, {
        "Env": r["env"], "Cmd": r["cmd"], "Entrypoint": r["entrypoint"],
        "WorkingDir": r["workdir"], "User": r["user"], "Labels": r["labels"],
        "ExposedPorts": sorted(r["expose"]), "Volumes": sorted(r["volumes"]),
        "StopSignal": r["stopsignal"], "Shell": r.get("shell")}


def _changes(found, base):
    """What a build added or changed ({path: Entry}) or removed ({path: None})."""
    changed = {p: e for p, e in found.items() if base.get(p) != e and p not in RECORD}
    return {**changed, **{p: None for p in base if p not in found}}


def _context(top, case, base_name, url):
    context = top / "ctx"
    for name, text in CONTEXT.items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            (context / name).mkdir(exist_ok=True)
        elif isinstance(text, bytes):
            (context / name).write_bytes(text)
        else:
            (context / name).write_text(text)
    (context / "Dockerfile").write_text((case.head + case.text + "\n").replace(BASE, base_name)
                                        .replace(URL, url))
    return context


def _buildkit(top, case, base, url=""):
    """BuildKit's build of `case`: (its {path: Entry}, its configuration)."""
    tag = f"{TAG}-{case.name}"
    (top / "docker").mkdir()
    try:
        return _docker_build(_context(top / "docker", case, base[1], url), tag, case.args)
    finally:
        subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)


def _berth_context(top, case, base, url=""):
    (top / "berth").mkdir()
    context = _context(top / "berth", case, "./base.sqsh", url)
    shutil.copy(base[2], context / "base.sqsh")
    return context


def differences(top, case, base, url):
    """{path or config key: (BuildKit's, berth's)} where the two builds differ."""
    docker_tree, docker_config = _buildkit(top, case, base, url)
    berth_tree, berth_config = _berth_build(_berth_context(top, case, base, url), top / "berth",
                                            case.args, oci=case.oci)
    docker_changes, berth_changes = _changes(docker_tree, base[0]), _changes(berth_tree, base[0])
    assert docker_changes or docker_config != BASE_CONFIG, "the case changes nothing"
    found = {p: (docker_changes.get(p), berth_changes.get(p))
             for p in sorted({*docker_changes, *berth_changes})
             if docker_changes.get(p) != berth_changes.get(p)}
    found.update((k, (v, berth_config[k])) for k, v in docker_config.items()
                 if berth_config[k] != v)
    return found


def _root_file(mode=0o644, owner="0:0", text=""):
    data = text.encode()
    return Entry("file", mode, len(data), hashlib.sha256(data).hexdigest(), "", owner)


# What docs/compatibility.md says differs: {case: {path or key: (BuildKit's, berth's)}}
DIFFERENCES = {
    # every file of a built image is root's
    "run-chown": {"f": (_root_file(owner="65534:65534"), _root_file())},
    # ADD --chmod of a URL: this daemon's frontend leaves 0600 (moby/buildkit#2114,
    # fixed in docker/dockerfile:1.3); berth applies the mode, as the fixed one does
    "add-url": {"usr/local/bin/x": (
        Entry("file", 0o600, 16, hashlib.sha256(b"served /files/x\n").hexdigest(), "", "0:0"),
        Entry("file", 0o755, 16, hashlib.sha256(b"served /files/x\n").hexdigest(), "", "0:0"))},
    # ADD --chown of an archive: this daemon's BuildKit keeps the members' owners
    # (moby/buildkit#1547, --chown applied to them from v0.23); berth applies it
    "add-archive-chown": {
        path: (Entry(kind, mode, size, digest, "", was), Entry(kind, mode, size, digest, "",
                                                               "1000:1001"))
        for path, kind, mode, size, digest, was in [
            ("y/r", "file", 0o644, 2, hashlib.sha256(b"r\n").hexdigest(), "0:0"),
            ("y/t", "dir", 0o755, 0, "", "1234:567"),
            ("y/t/f", "file", 0o644, 4, hashlib.sha256(b"t/f\n").hexdigest(), "1234:567")]},
    # a directory a RUN leaves without its owner's rwx keeps them in berth's image
    "dir-modes": {"ro": (Entry("dir", 0o500, 0, "", "", "0:0"),
                         Entry("dir", 0o700, 0, "", "", "0:0"))},
}


@pytest.fixture(scope="module")
def served():
    """An HTTP server on 127.0.0.1 (the Docker daemon fetches from the
    host's network): /files/NAME answers NAME's own bytes, with a
    Last-Modified; its URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = f"served {self.path}\n".encode()
            self.send_response(200 if self.path.startswith("/files/") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Last-Modified", "Tue, 03 Mar 2020 10:00:00 GMT")
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_berth_build_gives_what_buildkit_gives(tmp_path, case, base, served):
    assert differences(tmp_path, case, base, served) == DIFFERENCES.get(case.name, {})


# What BuildKit builds and berth build refuses, as docs/compatibility.md
# says: {case: what berth's one line of error says after FILE:LINE}
REFUSED = [
    (Case("run-after-user", "USER nobody\nRUN true"), ":3: RUN after USER nobody"),
]


@pytest.mark.parametrize("case, needle", REFUSED, ids=[case.name for case, _ in REFUSED])
def test_what_berth_build_refuses_buildkit_builds(tmp_path, case, needle, base):
    _buildkit(tmp_path, case, base)  # (it asserts the build succeeded)
    result = _run_berth(_berth_context(tmp_path, case, base), tmp_path / "berth", case.args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("berth: error: ") and f"Dockerfile{needle}" in lines[0]
    assert not (tmp_path / "berth/out.sqsh").exists()
