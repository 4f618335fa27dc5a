"""`berth build` end to end as an unprivileged user: real namespaces, RUN in
Berth's own container (remapped root), real squashfs images, the step
cache in the user's image cache. The base image is test_container's busybox
image (its image.json sets FOO, PATH and /work), taken as FROM ./base.sqsh.
Hostile build contexts are played by the tests: every refusal is one line
naming the file and line, and leaves no image, tree, mount or process."""

import json
import os
import shutil
import signal
import stat
import subprocess
import time

import pytest

from container_fixture import make_readable
from test_start_uri import registry  # noqa: F401 (a fixture: test/busybox:v1 pushed)
from test_userns import DEBIAN_IMAGE, probe_deb  # noqa: F401 (a fixture)

MULTI_STAGE = """\
# syntax=docker/dockerfile:1
ARG GREETING=hello
FROM ./base.sqsh AS first
ARG GREETING
RUN echo "$GREETING from first" > /greeting && mkdir -p /out && echo skipped > /out/x
FROM ./base.sqsh AS unused
RUN exit 7
FROM first AS final
ENV A="two words" B=${FOO}-and-more
WORKDIR app
COPY --from=first /greeting ./
COPY --chmod=750 tool.sh /usr/local/bin/
COPY tree/ /data/
RUN <<EOF
echo "$A" > /work/app/heredoc
id -u >> /work/app/heredoc
pwd >> /work/app/heredoc
EOF
SHELL ["/bin/sh", "-ec"]
RUN echo "$B" > shell-form
LABEL org.example.name="the app" version=1
EXPOSE 8080 53/udp
VOLUME /data
STOPSIGNAL SIGTERM
USER nobody
ENTRYPOINT ["/usr/local/bin/tool.sh"]
CMD ["one", "two"]
"""


@pytest.fixture
def build(berth, images, library):
    """A context with base.sqsh, and berth build's environment: the image
    cache and ENROOT_TEMP_PATH in the test's directory, the parser and the
    ignore files' matcher beside the package (what a node's venv holds with
    berth[build])."""
    import dockerfile
    import e2b_dockerfile_utils
    if not (library / os.path.basename(dockerfile.__file__)).exists():
        shutil.copy(dockerfile.__file__, library)
        os.chmod(library / os.path.basename(dockerfile.__file__), 0o755)
    matcher = os.path.dirname(e2b_dockerfile_utils.__file__)
    if not (library / os.path.basename(matcher)).exists():
        shutil.copytree(matcher, library / os.path.basename(matcher),
                        ignore=shutil.ignore_patterns("__pycache__"))
        make_readable(library)
    context = berth.base / "ctx"
    (context / "tree/sub").mkdir(parents=True)
    shutil.copy(images / "app.sqsh", context / "base.sqsh")
    (context / "tool.sh").write_text('#!/bin/sh\necho "tool $*"\n')
    (context / "tree/sub/file").write_text("deep\n")
    (context / "temp").mkdir()
    berth.env.update(ENROOT_CACHE_PATH=str(berth.base / "cache"), TMPDIR=str(context / "temp"))
    berth.chown(berth.base)
    return context


def write(berth, context, text, name="Containerfile"):
    (context / name).write_text(text)
    berth.chown(context / name)


def built(berth, *args):
    """berth build's summary line: (steps run, steps cached)."""
    result = berth("build", *args, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("berth build: "), result.stderr
    ran = int(summary.split(" run,")[0].rsplit(" ", 1)[1])
    cached = int(summary.split(" cached")[0].rsplit(" ", 1)[1])
    return ran, cached, result.stderr


def left_in(context):
    return sorted(os.listdir(context / "temp"))


def test_a_multi_stage_build_runs_as_its_instructions_say(berth, build):
    write(berth, build, MULTI_STAGE)
    ran, cached, said = built(berth, "-o", "out.sqsh", build)
    assert (ran, cached) == (6, 0)
    assert "exit 7" not in said  # the unused stage is not built
    assert "[1/" in said and "] RUN <<EOF" in said
    out = berth.base / "out.sqsh"
    record = json.loads(subprocess.run(["unsquashfs", "-cat", out, "etc/berth/image.json"],
                                       capture_output=True, check=True).stdout)
    assert record["env"] == ["FOO=image", "BAR=image", "PATH=/usr/local/bin:/bin",
                             "A=two words", "B=image-and-more"]
    assert record["workdir"] == "/work/app" and record["user"] == "nobody"
    assert record["entrypoint"] == ["/usr/local/bin/tool.sh"]
    assert record["cmd"] == ["one", "two"]
    assert record["labels"] == {"org.example.name": "the app", "version": "1"}
    assert record["expose"] == ["8080/tcp", "53/udp"] and record["volumes"] == ["/data"]
    assert record["stopsignal"] == "SIGTERM"
    # berth start runs it as an imported image: its workdir, its /etc/rc
    assert berth.ok("start", out, "cat", "greeting", "heredoc", "shell-form",
                    "/data/sub/file") == ("hello from first\ntwo words\n0\n/work/app\n"
                                          "image-and-more\ndeep\n")
    assert berth.ok("start", "--entrypoint", out) == "tool one two\n"
    assert berth.ok("start", out, "stat", "-c", "%a", "/usr/local/bin/tool.sh") == "750\n"
    listing = subprocess.run(["unsquashfs", "-lln", out, "usr/local/bin/tool.sh"],
                             capture_output=True, text=True, check=True).stdout
    assert " 0/0 " in listing  # every file root's, as in an imported image
    assert left_in(build) == []


def test_target_builds_that_stage_and_a_build_arg_reaches_it(berth, build):
    write(berth, build, MULTI_STAGE)
    built(berth, "--target", "first", "--build-arg", "GREETING=hi", "-o", "first.sqsh", build)
    assert berth.ok("start", berth.base / "first.sqsh", "cat", "/greeting") == "hi from first\n"
    assert berth.ok("start", berth.base / "first.sqsh", "ls", "/work") == ""  # no app


def test_a_rebuild_runs_no_step_and_a_change_reruns_from_its_line(berth, build):
    write(berth, build, MULTI_STAGE)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (6, 0)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 6)
    # a new mtime is no change: the cache reads contents
    os.utime(build / "tool.sh", (1, 1))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 6)
    # a changed file: its COPY and every step after it run again
    (build / "tree/sub/file").write_text("changed\n")
    ran, cached, said = built(berth, "-o", "out.sqsh", build)
    assert (ran, cached) == (3, 3), said
    assert "COPY tree/ /data/ (cached)" not in said and "COPY --chmod=750" in said
    # a changed line: the same, from that line
    write(berth, build, MULTI_STAGE.replace('echo "$B"', 'echo "$B" "$A"'))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (1, 5)
    assert berth.ok("start", berth.base / "out.sqsh", "cat", "shell-form", "/data/sub/file") \
        == "image-and-more two words\nchanged\n"
    assert built(berth, "--no-cache", "-o", "out.sqsh", build)[:2] == (6, 0)
    listed = berth.ok("cache", "list")
    assert "images" in listed


def _listed(berth):
    """{kind: (count, bytes)} of `berth cache`'s table."""
    return {kind: (int(count), int(size)) for kind, count, _, size in
            (line.split() for line in berth.ok("cache").splitlines()[2:])}


def test_cache_lists_the_steps_and_cache_mounts_a_build_keeps(berth, build):
    """`berth cache` counts the steps a build cached (the bytes of their
    layers) and its cache mounts (what their files take), read as a hostile
    user may have left them: no FIFO waited on, no link followed."""
    write(berth, build, "FROM ./base.sqsh\nRUN --mount=type=cache,target=/c "
                        "head -c 300000 /dev/urandom > /c/blob && echo one > /one\n"
                        "RUN echo two > /two\n")
    built(berth, "-o", "out.sqsh", build)
    cache = berth.base / "cache"
    records = [json.loads(p.read_text()) for p in (cache / "build-layers").glob("*.json")
               if not p.name.endswith(".owners.json")]
    assert len(records) == 3  # the two RUNs, and the image's record with WORKDIR
    blobs = {r["diff_id"].removeprefix("sha256:") for r in records}
    layer_bytes = sum((cache / "blobs/sha256" / d).stat().st_size for d in blobs)
    listed = _listed(berth)
    assert listed["steps"] == (3, layer_bytes)
    assert listed["mounts"][0] == 1 and 300000 <= listed["mounts"][1] < 400000, listed
    outside = berth.base / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(1 << 20))
    os.mkfifo(cache / "build-layers" / f"{5:064x}.json")
    (cache / "build-layers" / f"{6:064x}.json").symlink_to(
        next((cache / "build-layers").glob("*.json")))
    (mount,) = (cache / "build-cache").iterdir()
    (mount / "out").symlink_to(outside)
    berth.chown(cache, outside)
    again = _listed(berth)
    assert again["steps"] == listed["steps"] and again["mounts"][1] < 400000, again


def test_cache_prune_forgets_the_build_records_of_what_it_removed(berth, build):
    """The records a build keeps beside its layers (a step's layer, a COPY
    --from's checksum) go with what they name, read as a hostile user may
    have left them: a link is never followed, a FIFO never waited on, a
    record naming a path outside is no name, a huge one is not read whole."""
    write(berth, build, MULTI_STAGE)
    built(berth, "-o", "out.sqsh", build)
    cache = berth.base / "cache"
    sums, steps = cache / "build-sums", cache / "build-layers"
    (memo,) = os.listdir(sums)
    assert json.loads((sums / memo).read_text())["layers"]  # first's RUN
    outside = berth.base / "outside"
    outside.mkdir()
    (outside / "x").write_text("kept\n")
    hostile = {f"{1:064x}": '{"checksum": "' + "a" * 64 + '", "layers": ["sha256:../../../'
               f'{outside}/x"], "image": null}}', f"{2:064x}": "a" * 64,  # (the old form)
               f"{3:064x}": "[" * (2 << 20), "not-a-key": "{}"}
    for name, text in hostile.items():
        (sums / name).write_text(text)
    (sums / f"{4:064x}").symlink_to(outside / "x")
    os.mkfifo(sums / f"{5:064x}")
    (steps / f"{6:064x}.json").symlink_to(outside / "x")
    (steps / f"{7:064x}.owners.json").write_text("{}")  # (its step's record is gone)
    berth.chown(cache, outside)
    pruned = berth.ok("cache", "prune", "--older-than", "3650d")
    assert "forgot 1 build step, 4 COPY --from checksum and 0 ADD URL records" in pruned, pruned
    assert sorted(os.listdir(sums)) == sorted([memo, f"{4:064x}", f"{5:064x}"])
    assert (outside / "x").read_text() == "kept\n"
    (sums / memo).write_text("[" * (2 << 20))  # (a build reads it as no record, too)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 6)
    assert json.loads((sums / memo).read_text())["layers"]
    pruned = berth.ok("cache", "prune", "--max-size", "0")
    assert "ADD URL records of layers or images no longer cached" in pruned
    # (the links and the FIFO are no records of a build's: the user's own)
    assert sorted(os.listdir(sums)) == [f"{4:064x}", f"{5:064x}"]
    assert sorted(os.listdir(steps)) == [f"{6:064x}.json"]
    assert (outside / "x").read_text() == "kept\n"
    assert built(berth, "-o", "out.sqsh", build)[:2] == (6, 0)


REMOVING = """\
FROM ./base.sqsh
RUN mkdir -p /made/deep /gone/deep && echo a > /made/kept && echo b > /made/removed \\
 && echo f > /gone/deep/f && ln /made/kept /made/kept-too && chmod 4755 /made/kept
RUN rm /made/removed && rm -r /gone && mkdir /gone && echo new > /gone/only
RUN echo {} > /last
"""


def _listing(out):
    """The image's entries, modes and link counts, but /last and the record."""
    found = subprocess.run(
        ["unsquashfs", "-lln", out], capture_output=True, text=True, check=True).stdout
    return sorted(" ".join(line.split()[:3] + line.split()[5:]) for line in found.splitlines()
                  if line.startswith(("-", "d", "l")) and "/last" not in line
                  and "/etc/" not in line)


def test_a_change_at_the_end_runs_that_step_on_the_steps_layers(berth, build):
    """The tree a rerun step runs in is the base with the cached steps'
    layers over it: what they removed stays removed, a directory they
    replaced holds only its new entries, a hard link stays one."""
    write(berth, build, REMOVING.format("one"))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (3, 0)
    cold = _listing(berth.base / "out.sqsh")
    write(berth, build, REMOVING.format("two"))
    ran, cached, said = built(berth, "-o", "out.sqsh", build)
    assert (ran, cached) == (1, 2), said
    out = berth.base / "out.sqsh"
    assert _listing(out) == cold
    assert berth.ok("start", out, "cat", "/last", "/gone/only", "/made/kept-too") == \
        "two\nnew\na\n"
    assert berth.ok("start", out, "ls", "/gone", "/made") == \
        "/gone:\nonly\n\n/made:\ndeep\nkept\nkept-too\n"
    assert berth.ok("start", out, "stat", "-c", "%h %a", "/made/kept") == "2 4755\n"
    assert left_in(build) == []


def test_a_shell_the_base_image_set_is_the_shell_of_a_build_from_it(berth, build):
    """SHELL is kept in the image (BuildKit's Config.Shell): a build FROM
    that image runs its shell forms with it (busybox's sh says $0 "sh")."""
    write(berth, build, 'FROM ./base.sqsh\nSHELL ["/bin/busybox", "sh", "-c"]\n')
    built(berth, "-o", "ctx/shelled.sqsh", build)
    record = json.loads(subprocess.run(["unsquashfs", "-cat", build / "shelled.sqsh",
                                        "etc/berth/image.json"], capture_output=True,
                                       check=True).stdout)
    assert record["shell"] == ["/bin/busybox", "sh", "-c"]
    write(berth, build, 'FROM ./shelled.sqsh\nRUN echo "$0" > /zero\n')
    built(berth, "-o", "out.sqsh", build)
    assert berth.ok("start", berth.base / "out.sqsh", "cat", "/zero") == "sh\n"


def _refused(berth, build, text, needle, *args):
    write(berth, build, text)
    # (-q: the progress lines of the steps before a refused COPY go)
    line = berth.fails("build", "-q", *args, "-o", "out.sqsh", build, needle=needle)
    assert not (berth.base / "out.sqsh").exists()
    assert left_in(build) == []
    return line


@pytest.mark.parametrize("source, why", [
    ("../outside", "'..' leaves the build context"),
    ("/etc/passwd", "an absolute path"),
    ("link-out", "link-out is a symbolic link"),
    ("dir-link/file", "dir-link is a symbolic link"),
    ("fifo", "fifo is a FIFO"),
    ("tree-with-fifo", "pipe is a FIFO"),
    ("missing", "not found in the build context"),
    ("nothing*", "matches no file"),
])
def test_a_hostile_context_is_refused_naming_file_and_line(berth, build, source, why):
    (build / "link-out").symlink_to("/etc/passwd")
    (build / "dir-link").symlink_to("/etc")
    os.mkfifo(build / "fifo")
    (build / "tree-with-fifo").mkdir()
    os.mkfifo(build / "tree-with-fifo/pipe")
    (berth.base / "outside").write_text("secret\n")
    berth.chown(berth.base)
    line = _refused(berth, build, f"FROM ./base.sqsh\nRUN true\nCOPY {source} /x\n", why)
    assert f"{build}/Containerfile:3: COPY source '{source}'" in line


@pytest.mark.parametrize("text, needle, args", [
    ("FROM ./base.sqsh\nFROB x\n", "Containerfile:2: unknown instruction 'FROB'", ()),
    ("FROM ./base.sqsh\nRUN --mount=type=secret,id=x true\n",
     "Containerfile:2: RUN --mount=type=secret: not supported", ()),
    ("FROM ./base.sqsh\nRUN --mount=type=ssh true\n",
     "Containerfile:2: RUN --mount=type=ssh: not supported", ()),
    ("FROM ./base.sqsh\nRUN true\nRUN --network=bridge true\n",
     "Containerfile:3: RUN --network=bridge: expected default, host or none", ()),
    ("FROM ./base.sqsh\nRUN --mount=type=cache,target=/c,uid=1000 true\n",
     "Containerfile:2: RUN --mount=type=cache,target=/c,uid=1000: uid=1000", ()),
    ("FROM ./base.sqsh\nRUN --mount=type=tmpfs,target=/t,from=x true\n",
     "from: not a field of a tmpfs mount", ()),
    ("FROM ./base.sqsh AS one\nRUN --mount=type=bind,from=later,target=/t true\n"
     "FROM ./base.sqsh AS later\n", "Containerfile:2: RUN --mount from=later: no earlier stage",
     ("--target", "one")),
    ("FROM ./base.sqsh\nARG T=/c\nRUN true\nRUN --mount=type=cache,target=$T,sharing=$T true\n",
     "Containerfile:4: RUN --mount=type=cache,target=/c,sharing=/c: sharing=/c", ()),
    ("FROM ./base.sqsh\nRUN true\nRUN --mount=type=bind,source=../x,target=/t true\n",
     "Containerfile:3: COPY source '../x': '..' leaves the build context", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK --interval=5 CMD true\n",
     "Containerfile:2: HEALTHCHECK --interval=5: expected a duration", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK --retries=-1 CMD true\n",
     "Containerfile:2: HEALTHCHECK --retries=-1: expected a whole number", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK --timeout=10us CMD true\n", "less than 1ms", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK --user=x CMD true\n",
     "Containerfile:2: HEALTHCHECK --user: not supported", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK --interval=1s NONE\n", "HEALTHCHECK NONE takes no", ()),
    ("FROM ./base.sqsh\nHEALTHCHECK true\n", "expected HEALTHCHECK [FLAGS] CMD", ()),
    ("FROM ./base.sqsh\nONBUILD ONBUILD RUN true\n", "Containerfile:2: ONBUILD ONBUILD: not", ()),
    ("FROM ./base.sqsh\nONBUILD FROM x\n", "Containerfile:2: ONBUILD FROM: not a trigger", ()),
    ("FROM ./base.sqsh\nONBUILD FROB x\n", "Containerfile:2: unknown instruction 'FROB'", ()),
    ("FROM ./base.sqsh\nONBUILD RUN --mount=type=ssh true\n",
     "Containerfile:2: RUN --mount=type=ssh: not supported", ()),
    ("FROM ./base.sqsh\nCOPY --chown=ghost tool.sh /\n",
     "Containerfile:2: COPY --chown=ghost: no user 'ghost' in the image's /etc/passwd", ()),
    ("FROM ./base.sqsh\nCOPY --chown=0:ghosts tool.sh /\n",
     "Containerfile:2: COPY --chown=0:ghosts: no group 'ghosts' in the image's /etc/group", ()),
    ("FROM ./base.sqsh\nUSER nobody\nRUN true\n", "Containerfile:3: RUN after USER nobody", ()),
    ("FROM ./base.sqsh\nRUN <<EOF\ntrue\n", "unterminated heredoc", ()),
    ("# syntax=example.com/evil:1\nFROM ./base.sqsh\n", "Containerfile:1: syntax directive", ()),
    ("FROM ./base.sqsh\n", "--build-arg A: the value holds a newline", ("--build-arg", "A=x\ny")),
    ("FROM ./base.sqsh\n", "--target nope: no stage", ("--target", "nope")),
    ("FROM ./missing.sqsh\n", "Containerfile:1: FROM ./missing.sqsh", ()),
])
def test_what_berth_build_does_not_do_is_refused_in_one_line(berth, build, text, needle, args):
    _refused(berth, build, text, needle, *args)


def test_what_a_run_locks_its_owner_out_of_is_packed_and_removed(berth, build):
    """A directory made 0000 inside (the container's root is the caller)
    is packed as the caller and removed at the end all the same."""
    write(berth, build, "FROM ./base.sqsh\nRUN mkdir -p /locked/in && echo x > /locked/in/f "
                        "&& chmod 000 /locked/in /locked\n")
    built(berth, "-o", "out.sqsh", build)
    listing = subprocess.run(["unsquashfs", "-lln", berth.base / "out.sqsh", "locked/in/f"],
                             capture_output=True, text=True, check=True).stdout
    assert "locked/in/f" in listing and left_in(build) == []
    write(berth, build, "FROM ./base.sqsh\nRUN mkdir /gone && chmod 000 /gone && exit 4\n")
    assert berth("build", "-q", "-o", "out2.sqsh", build).returncode == 1
    assert left_in(build) == []


def test_a_failing_run_shows_its_output_and_status(berth, build):
    write(berth, build, "FROM ./base.sqsh\nRUN echo before-failing; exit 3\n")
    result = berth("build", "-q", "-o", "out.sqsh", build)
    assert result.returncode == 1
    assert "before-failing" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"berth: error: {build}/Containerfile:2: RUN echo before-failing; exit 3 exited "
        "with status 3")
    assert not (berth.base / "out.sqsh").exists() and left_in(build) == []


def test_a_noexec_temp_path_is_refused_before_the_first_run(berth, build):
    """ENROOT_TEMP_PATH on a file system mounted noexec (/tmp is, on some
    nodes): a RUN could run nothing in a tree there. The build says so in
    one line before its first step, and leaves nothing; a build with no
    RUN runs no program there, and is built."""
    temp = berth.base / "noexec"
    temp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"noexec,size=256m,uid={berth.user.pw_uid},"
                    f"gid={berth.user.pw_gid},mode=0700", "berth-noexec", temp], check=True)
    try:
        write(berth, build, "FROM ./base.sqsh\nCOPY tool.sh /\nRUN echo ran\n")
        result = berth("build", "-o", "out.sqsh", build, env={"ENROOT_TEMP_PATH": str(temp)})
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            f"berth: error: {build}/Containerfile:3: RUN needs ENROOT_TEMP_PATH ({temp}) on "
            "a file system that allows running programs; it is mounted noexec"]
        assert os.listdir(temp) == [] and not (berth.base / "out.sqsh").exists()
        assert not (berth.base / "cache").exists()  # (not even the COPY before it)
        write(berth, build, "FROM ./base.sqsh\nCOPY tool.sh /\n")
        result = berth("build", "-o", "out.sqsh", build, env={"ENROOT_TEMP_PATH": str(temp)})
        assert result.returncode == 0, result.stderr
        assert os.listdir(temp) == [] and (berth.base / "out.sqsh").exists()
        # a base image's ONBUILD RUN is refused at the FROM line that runs it
        write(berth, build, "FROM ./base.sqsh\nONBUILD RUN echo triggered > /t\n")
        built(berth, "-o", "parent.sqsh", build)
        shutil.copy(berth.base / "parent.sqsh", build / "parent.sqsh")
        write(berth, build, "FROM ./parent.sqsh\nCOPY tool.sh /\n")
        berth.chown(build)
        result = berth("build", "-o", "child.sqsh", build, env={"ENROOT_TEMP_PATH": str(temp)})
        assert result.returncode == 1
        assert result.stderr.splitlines()[-1] == (
            f"berth: error: {build}/Containerfile:1: the base image's trigger ONBUILD RUN echo "
            f"triggered > /t needs ENROOT_TEMP_PATH ({temp}) on a file system that allows "
            "running programs; it is mounted noexec")
        assert os.listdir(temp) == [] and not (berth.base / "child.sqsh").exists()
    finally:
        subprocess.run(["umount", temp], check=True)


def test_sigint_mid_build_leaves_no_image_tree_mount_or_process(berth, build):
    write(berth, build, "FROM ./base.sqsh\nRUN echo started && sleep 60\n")
    process = berth.interruptible("build", "-o", "out.sqsh", build)
    seen = ""
    while "started" not in seen:
        seen += process.stderr.readline()
        assert process.poll() is None, seen
    # (the ^C lands once the step's sleep runs, as a user's in a long step does)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-s", str(process.pid), "-x", "sleep"],
                         capture_output=True, check=False).returncode != 0:
        assert time.monotonic() < deadline and process.poll() is None, "no sleep started"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's ^C reaches the whole group
    try:
        assert process.wait(timeout=30) == 130, process.stderr.read()
    finally:  # (a build that outlived the ^C takes no sleeper into the next test)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert not (berth.base / "out.sqsh").exists() and left_in(build) == []
    time.sleep(0.2)
    sleepers = subprocess.run(["pgrep", "-u", berth.user.pw_name, "-f", "sleep 60"],
                              capture_output=True, text=True, check=False).stdout
    assert sleepers == ""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        assert str(build) not in f.read()
    assert berth.leftovers() == []


@pytest.mark.skipif(not DEBIAN_IMAGE.exists(), reason="needs scripts/test-image.sh's image")
def test_dpkg_and_apt_run_as_the_remapped_root(berth, build, probe_deb):
    """dpkg's chowns go through the fake-chown filter, and apt is told to
    stay root (it cannot switch to _apt where one uid is mapped), in the
    RUN's private /tmp, not in the image."""
    shutil.copy(DEBIAN_IMAGE, build / "debian.sqsh")
    shutil.copy(probe_deb, build / "probe.deb")
    berth.chown(build)
    write(berth, build, "FROM ./debian.sqsh\nCOPY probe.deb /root/\n"
                        "RUN dpkg -i /root/probe.deb && rm /root/probe.deb\n"
                        "RUN apt-config dump | grep Sandbox::User > /sandbox\n"
                        "RUN chown nobody /sandbox\n")
    built(berth, "-o", "deb.sqsh", build)
    out = berth.base / "deb.sqsh"
    assert berth.ok("start", out, "sh", "-c", "dpkg -s bctr-probe | grep ^Status; "
                    "/usr/share/bctr-probe/tool; cat /sandbox") == (
        'Status: install ok installed\nprobe\nAPT::Sandbox::User "root";\n')
    listing = subprocess.run(["unsquashfs", "-lln", out, "tmp"], capture_output=True,
                             text=True, check=True).stdout
    assert ".berth-apt.conf" not in listing


def test_an_edfs_containerfile_is_built_at_first_use_then_reused(berth, build):
    """CSCS's `containerfile` key: relative to the EDF's directory; the EDF's
    `image` takes the place of the file's first FROM."""
    write(berth, build, "FROM ./not-this.sqsh\nRUN echo from-edf > /made\n",
          name="Containerfile.devtools")
    edf = berth.write("ctx/devtools.toml", 'image = "./base.sqsh"\n'
                      'containerfile = "./Containerfile.devtools"\nworkdir = "/work"\n')
    assert berth.ok("edf", "check", edf) == ""
    shown = json.loads(berth.ok("edf", "show", "--json", edf, timeout=120))
    assert shown["containerfile"] == str(build / "Containerfile.devtools")
    assert shown["sources"]["image"] == shown["containerfile"]
    image = shown["image"]
    assert image.startswith(str(berth.base / "cache/images/"))
    assert berth.ok("start", image, "cat", "/made") == "from-edf\n"
    cached = sorted(os.listdir(berth.base / "cache/images"))
    again = json.loads(berth.ok("edf", "show", "--json", edf))
    assert again["image"] == image and sorted(os.listdir(berth.base / "cache/images")) == cached
    spank = berth.ok("edf", "show", "--spank", edf)
    assert f"image={image}\n" in spank and "containerfile" not in spank
    write(berth, build, "FROM ./base.sqsh\nFROB\n", name="Containerfile.devtools")
    berth.fails("edf", "check", edf, needle="Containerfile.devtools:2: unknown instruction")


def test_an_edfs_built_image_is_put_in_the_edf_build_path_once(berth, build):
    """BERTH_EDF_BUILD_PATH (a shared filesystem's directory, for the job's
    nodes): the built image is copied there under its build's key, in a
    directory made the user's alone, and not copied again for the same
    build; a changed build is another file."""
    write(berth, build, "FROM ./base.sqsh\nRUN echo one > /made\n")
    edf = berth.write("ctx/e.toml", 'containerfile = "./Containerfile"\n')
    shared = berth.base / "shared/builds"
    berth.env.update(BERTH_EDF_BUILD_PATH=str(shared))
    image = json.loads(berth.ok("edf", "show", "--json", edf, timeout=120))["image"]
    assert os.path.dirname(image) == str(shared)
    assert os.path.basename(image) in os.listdir(berth.base / "cache/images")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o700
    assert berth.ok("start", image, "cat", "/made") == "one\n"
    first = os.stat(image)
    assert json.loads(berth.ok("edf", "show", "--json", edf))["image"] == image
    assert os.stat(image).st_ino == first.st_ino  # not copied again
    write(berth, build, "FROM ./base.sqsh\nRUN echo two > /made\n")
    changed = json.loads(berth.ok("edf", "show", "--json", edf, timeout=120))["image"]
    assert changed != image and os.path.dirname(changed) == str(shared)
    assert berth.ok("start", changed, "cat", "/made") == "two\n"
    berth.env.update(BERTH_EDF_BUILD_PATH="shared/builds")
    berth.fails("edf", "show", edf,
                needle="BERTH_EDF_BUILD_PATH=shared/builds: not an absolute path")
    # a directory someone else could write: another user could plant a build
    os.chmod(shared, 0o777)
    berth.env.update(BERTH_EDF_BUILD_PATH=str(shared))
    berth.fails("edf", "show", edf, needle=f"BERTH_EDF_BUILD_PATH {shared}: is writable by others")


def test_from_a_registry_image_goes_through_the_image_cache(berth, build, registry):
    """FROM HOST:PORT/IMAGE:TAG (Docker's form) is pulled as berth import
    pulls docker://HOST:PORT#IMAGE:TAG, into the image cache, once."""
    berth.env.update(ENROOT_ALLOW_HTTP="yes")
    write(berth, build, f"FROM {registry.host}/test/busybox:v1\n"
                        'RUN echo "$FROM_IMAGE" > /from-image\n')
    assert built(berth, "-o", "out.sqsh", build)[:2] == (1, 0)
    assert berth.ok("start", berth.base / "out.sqsh", "cat", "/from-image") == "yes\n"
    pulled = json.loads(subprocess.run(
        ["unsquashfs", "-cat", berth.base / "out.sqsh", "etc/berth/image.json"],
        capture_output=True, check=True).stdout)
    assert "FROM_IMAGE=yes" in pulled["env"]
    images_before = sorted(os.listdir(berth.base / "cache/images"))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 1)  # the tag asked again, as BuildKit
    assert sorted(os.listdir(berth.base / "cache/images")) == images_before


def test_copy_and_bind_mounts_take_from_a_registry_image_by_name(berth, build, registry):
    """COPY --from=IMAGE and RUN --mount=type=bind,from=IMAGE name an image
    that is no stage's, as BuildKit reads them: it is pulled once through
    the image cache, and its files are copied or mounted; its name's
    digest is in the keys, so a rebuild runs no step."""
    berth.env.update(ENROOT_ALLOW_HTTP="yes")
    image = f"{registry.host}/test/busybox:v1"
    write(berth, build, f"FROM ./base.sqsh\nCOPY --from={image} /etc/berth/image.json /got\n"
                        f"RUN --mount=type=bind,from={image},source=/etc/berth,target=/m "
                        "grep -c FROM_IMAGE /m/image.json > /mounted\n"
                        f"COPY --from={image} /bin/sh /sh-again\n")
    ran, cached, said = built(berth, "-o", "out.sqsh", build)
    assert (ran, cached) == (3, 0) and said.count(f"FROM {image}\n") == 1
    out = berth.base / "out.sqsh"
    assert berth.ok("start", out, "sh", "-c", "grep -c FROM_IMAGE /got; cat /mounted; "
                    "test -f /sh-again && echo copied") == "1\n1\ncopied\n"
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 3)


IGNORED = """\
FROM ./base.sqsh
COPY . /ctx/
RUN ls -a /ctx /ctx/tree > /listing
"""


def test_an_ignore_file_leaves_files_out_of_copy_and_of_the_key(berth, build):
    (build / ".dockerignore").write_text(
        "# what the build does not see\ntemp\n/base.sqsh\ntree/*.log\n!tree/keep.log\n"
        "*.md\n!README*.md\nsecret.txt\n**/cache\n")
    for name in ("tree/skip.log", "tree/keep.log", "notes.md", "README.md", "secret.txt",
                 "tree/sub/cache/blob"):
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        (build / name).write_text("v1\n")
    write(berth, build, IGNORED)
    berth.chown(build)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 0)
    out = berth.base / "out.sqsh"
    assert berth.ok("start", out, "cat", "/listing").split() == [
        "/ctx:", ".", "..", ".dockerignore", "Containerfile", "README.md", "tool.sh", "tree",
        "/ctx/tree:", ".", "..", "keep.log", "sub"]
    assert berth.ok("start", out, "ls", "/ctx/tree/sub") == "file\n"  # no cache/
    # an ignored file changed: no step runs; a kept one: the COPY runs again
    for name in ("tree/skip.log", "secret.txt", "tree/sub/cache/blob", "notes.md"):
        (build / name).write_text("v2\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 2)
    (build / "tree/keep.log").write_text("v2\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 0)
    # a source the file leaves out is refused as Docker does: not in the context
    os.unlink(out)
    line = _refused(berth, build, "FROM ./base.sqsh\nCOPY secret.txt /\n", "secret.txt")
    assert f"Containerfile:2: COPY source 'secret.txt': left out of the build context by " \
           f"{build}/.dockerignore" in line
    _refused(berth, build, "FROM ./base.sqsh\nCOPY *.txt /\n", "matches no file")


def test_the_containerfiles_own_ignore_file_wins(berth, build):
    (build / ".dockerignore").write_text("temp\nbase.sqsh\ntool.sh\n")
    (build / "app.file.dockerignore").write_text("temp\nbase.sqsh\ntree\n")
    write(berth, build, "FROM ./base.sqsh\nCOPY . /ctx/\n", name="app.file")
    built(berth, "-f", build / "app.file", "-o", "out.sqsh", build)
    assert berth.ok("start", berth.base / "out.sqsh", "ls", "/ctx").split() == [
        "app.file", "app.file.dockerignore", "tool.sh"]
    (build / "app.file.dockerignore").write_text("[bad\n")
    berth.fails("build", "-f", build / "app.file", "-o", "bad.sqsh", build,
                needle=f"{build}/app.file.dockerignore:1: Invalid ignore pattern '[bad'")
    assert not (berth.base / "bad.sqsh").exists() and left_in(build) == []


MOUNTS = """\
FROM ./base.sqsh AS tools
RUN mkdir -p /opt && echo from-stage > /opt/tool
FROM ./base.sqsh
RUN --mount=type=cache,target=/var/cache/app,id=app \\
    echo run >> /var/cache/app/log && wc -l < /var/cache/app/log > /cache-count
RUN --mount=type=bind,source=tree,target=/src cat /src/sub/file > /from-context && \\
    ! touch /src/new 2>/dev/null
RUN --mount=type=bind,source=tree,target=/src,rw touch /src/new && echo rw > /rw-ok
RUN --mount=type=bind,from=tools,source=/opt,target=/tools cat /tools/tool > /from-stage
RUN --mount=type=tmpfs,target=/scratch,size=1M \\
    awk '$2 == "/scratch" { print $3 }' /proc/mounts > /tmpfs-type
RUN --network=none awk -F: 'NR > 2 { print $1 }' /proc/net/dev | tr -d ' ' > /nets
"""


def test_run_mounts_and_network_are_the_steps_alone(berth, build):
    """Each mount is there for its RUN only: none is in the image, nor the
    mount points made for them; a cache's contents outlive the build."""
    write(berth, build, MOUNTS)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (7, 0)
    out = berth.base / "out.sqsh"
    assert berth.ok("start", out, "cat", "/cache-count", "/from-context", "/rw-ok",
                    "/from-stage", "/tmpfs-type", "/nets") == \
        "1\ndeep\nrw\nfrom-stage\ntmpfs\nlo\n"
    assert berth.ok("start", out, "sh", "-c", "for p in /var /src /tools /scratch; do "
                    "test -e $p && echo $p; done; echo end") == "end\n"
    assert not (build / "tree/new").exists()  # rw: the changes are discarded
    assert len(os.listdir(berth.base / "cache/build-cache")) == 1
    # a cache's contents are no part of the key; they survive a rebuild
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 7)
    assert built(berth, "--no-cache", "-o", "out.sqsh", build)[:2] == (7, 0)
    assert berth.ok("start", out, "cat", "/cache-count") == "2\n"
    # a bind of the context is: a changed file runs its steps again
    (build / "tree/sub/file").write_text("changed\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (5, 2)
    assert berth.ok("start", out, "cat", "/from-context") == "changed\n"


SEEDED = """\
FROM ./base.sqsh AS seed
RUN mkdir -p /seed/sub && echo seeded > /seed/sub/f
FROM ./base.sqsh
RUN --mount=type=cache,target=/c,id=s,from=seed,source=/seed cat /c/sub/f > /got && \\
    echo more > /c/g
RUN --mount=type=cache,target=/c,id=s,from=seed,source=/seed{} ls /c > /list
"""


def test_a_cache_mount_from_a_stage_begins_as_its_copy(berth, build):
    """type=cache,from=STAGE,source=DIR: a new cache holds DIR's files; an
    existing one is kept as it is; a source the stage lacks is refused
    naming the file and line, and no half-made cache stays."""
    write(berth, build, SEEDED.format(""))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (3, 0)
    assert berth.ok("start", berth.base / "out.sqsh", "cat", "/got", "/list") == \
        "seeded\ng\nsub\n"
    write(berth, build, SEEDED.format(" --mount=type=cache,target=/d,id=t,from=seed,"
                                      "source=/nowhere"))
    berth.fails("build", "-q", "-o", "out2.sqsh", build,
                needle="Containerfile:6: RUN --mount from=seed: /nowhere: not found")
    caches = berth.base / "cache/build-cache"
    assert sorted(sorted(os.listdir(caches / d)) for d in os.listdir(caches)) == [
        ["data", "id", "lock"], ["id", "lock"]]
    assert left_in(build) == []


def test_cache_mounts_stay_under_their_bound(berth, build):
    write(berth, build, "FROM ./base.sqsh\nRUN --mount=type=cache,target=/c,id=big \\\n"
          "    ls /c | wc -l > /count && dd if=/dev/zero of=/c/blob bs=1k count=200\n")
    berth.env.update(BERTH_BUILD_CACHE_MAX_SIZE="64K")
    said = built(berth, "-o", "out.sqsh", build)[2]
    assert "removed the cache mount 'big' (the least recently used)" in said
    assert os.listdir(berth.base / "cache/build-cache") == []
    built(berth, "--no-cache", "-o", "out.sqsh", build)
    assert berth.ok("start", berth.base / "out.sqsh", "cat", "/count") == "0\n"
    berth.env.update(BERTH_BUILD_CACHE_MAX_SIZE="lots")
    os.unlink(berth.base / "out.sqsh")
    _refused(berth, build, "FROM ./base.sqsh\nRUN --mount=type=cache,target=/c true\n",
             "BERTH_BUILD_CACHE_MAX_SIZE=lots: expected a size")


PARENT = """\
FROM ./base.sqsh
HEALTHCHECK --interval=1m30s --timeout=5s --start-period=1.5s --start-interval=500ms \\
    --retries=4 CMD test -e /ready || exit 1
ONBUILD ENV FROM_TRIGGER=yes
ONBUILD COPY --chmod=600 tool.sh /from-trigger
ONBUILD RUN echo "ran as $FROM_TRIGGER" > /trigger-ran
"""


def _record(path):
    return json.loads(subprocess.run(["unsquashfs", "-cat", path, "etc/berth/image.json"],
                                     capture_output=True, check=True).stdout)


def test_healthcheck_and_onbuild_are_recorded_and_triggers_run_in_a_child(berth, build):
    write(berth, build, PARENT)
    assert built(berth, "-o", "parent.sqsh", build)[:2] == (0, 0)  # (no step changes the root)
    parent = _record(berth.base / "parent.sqsh")
    assert parent["healthcheck"] == {
        "Test": ["CMD-SHELL", "test -e /ready || exit 1"], "Interval": 90_000_000_000,
        "Timeout": 5_000_000_000, "StartPeriod": 1_500_000_000, "StartInterval": 500_000_000,
        "Retries": 4}
    assert parent["onbuild"] == ["ENV FROM_TRIGGER=yes", "COPY --chmod=600 tool.sh /from-trigger",
                                 'RUN echo "ran as $FROM_TRIGGER" > /trigger-ran']
    assert berth.ok("start", berth.base / "parent.sqsh", "sh", "-c",
                    "test -e /trigger-ran || echo none") == "none\n"
    shutil.copy(berth.base / "parent.sqsh", build / "parent.sqsh")
    write(berth, build, 'FROM ./parent.sqsh\nHEALTHCHECK CMD ["/bin/true", "x"]\n')
    berth.chown(build)
    ran, _, said = built(berth, "-o", "child.sqsh", build)
    assert ran == 2 and "] COPY --chmod=600 tool.sh /from-trigger" in said
    child = berth.base / "child.sqsh"
    assert berth.ok("start", child, "sh", "-c", "cat /trigger-ran; stat -c %a /from-trigger; "
                    "echo $FROM_TRIGGER") == "ran as yes\n600\nyes\n"
    record = _record(child)
    assert record["onbuild"] == []  # a trigger runs once: the child keeps none
    assert record["healthcheck"]["Test"] == ["CMD", "/bin/true", "x"]
    write(berth, build, "FROM ./parent.sqsh\nHEALTHCHECK NONE\n")
    built(berth, "-o", "none.sqsh", build)
    assert _record(berth.base / "none.sqsh")["healthcheck"] == {"Test": ["NONE"]}
    # a trigger that fails names the FROM line that ran it
    (build / "tool.sh").unlink()
    line = _refused(berth, build, "FROM ./base.sqsh\nRUN true\nFROM ./parent.sqsh\n",
                    "COPY source 'tool.sh': not found")
    assert f"{build}/Containerfile:3: " in line
    write(berth, build, "FROM ./base.sqsh\nONBUILD COPY --from=tools /opt /opt\n")
    built(berth, "-o", "from-stage.sqsh", build)
    shutil.copy(berth.base / "from-stage.sqsh", build / "parent.sqsh")
    line = _refused(berth, build, "FROM ./base.sqsh AS tools\nFROM ./parent.sqsh\n",
                    "berth build runs no trigger that takes from a stage")
    assert f"{build}/Containerfile:2: the base image's trigger ONBUILD COPY --from" in line


def _tar(path, members, mode="w"):
    """A tar archive at `path` of (TarInfo fields, data) pairs."""
    import io
    import tarfile
    with tarfile.open(path, mode) as tar:
        for fields, data in members:
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)


def test_add_unpacks_a_local_archive_and_keeps_a_hostile_one_under_its_destination(
        berth, build):
    import tarfile
    _tar(build / "hostile.tar.gz", [
        ({"name": "dir", "type": tarfile.DIRTYPE, "mode": 0o755}, b""),
        ({"name": "dir/file", "mode": 0o640}, b"inside\n"),
        ({"name": "../../escape", "mode": 0o644}, b"clamped\n"),
        ({"name": "/absolute", "mode": 0o644}, b"relative now\n"),
        ({"name": "up", "type": tarfile.SYMTYPE, "linkname": "/"}, b""),
        ({"name": "up/etc/through-link", "mode": 0o644}, b"under dest\n"),
        ({"name": "hard", "type": tarfile.LNKTYPE, "linkname": "dir/file"}, b""),
    ], mode="w:gz")
    for suffix, mode in (("tar", "w"), ("tar.bz2", "w:bz2"), ("tar.xz", "w:xz")):
        _tar(build / f"plain.{suffix}", [({"name": f"from-{suffix}", "mode": 0o644}, b"x\n")],
             mode=mode)
    import gzip
    (build / "notes.txt.gz").write_bytes(gzip.compress(b"not a tar\n"))
    write(berth, build, "FROM ./base.sqsh\nADD hostile.tar.gz /dest\n"
          "ADD plain.tar plain.tar.bz2 plain.tar.xz notes.txt.gz /many/\n")
    berth.chown(build)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 0)
    out = berth.base / "out.sqsh"
    assert berth.ok("start", out, "sh", "-c",
                    "cd /dest && cat dir/file escape absolute etc/through-link hard && "
                    "stat -c %a dir/file && readlink up && ls /many && "
                    "ls /escape /absolute /etc/through-link 2>&1 | wc -l") == (
        "inside\nclamped\nrelative now\nunder dest\ninside\n640\n/\n"
        "from-tar\nfrom-tar.bz2\nfrom-tar.xz\nnotes.txt.gz\n3\n")
    # hostile members the build cannot make, or a hard link out: one line each
    os.unlink(out)
    _tar(build / "device.tar", [({"name": "null", "type": tarfile.CHRTYPE}, b"")])
    _tar(build / "hard-out.tar", [({"name": "h", "type": tarfile.LNKTYPE,
                                    "linkname": "../etc/passwd"}, b"")])
    for name, why in (("device.tar", "member 'null': a device or FIFO"),
                      ("hard-out.tar", "member 'h': a hard link to ../etc/passwd")):
        berth.chown(build)
        line = _refused(berth, build, f"FROM ./base.sqsh\nRUN true\nADD {name} /x/\n", why)
        assert f"{build}/Containerfile:3: ADD {name}: " in line
    _tar(build / "broken.tar", [({"name": "big", "mode": 0o644}, b"x" * 4096)])
    with open(build / "broken.tar", "r+b") as f:
        f.truncate(512 + 1000)  # (its header whole, its data cut short)
    berth.chown(build)
    _refused(berth, build, "FROM ./base.sqsh\nADD broken.tar /x/\n",
             "Containerfile:2: ADD broken.tar: a broken archive")
