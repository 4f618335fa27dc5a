"""berth build's reading of a Containerfile, without running it: BuildKit's
word rules (quotes, escapes, ${VAR} forms), the parser directives, and the
plan's stages, ARG scoping and --target (unit tier: nothing is started)."""

import os
import sys

import pytest

from berth.build import parse, plan, recorded, runflags, words
from berth.errors import BerthError

ENV = {"A": "x", "EMPTY": ""}


@pytest.mark.parametrize("text, expected", [
    ('a"b c"$A', ["ab cx"]),
    ("${A}y ${UNSET:-def} ${EMPTY:-d2} ${EMPTY-d3} ${A:+alt} ${UNSET+alt}",
     ["xy", "def", "d2", "", "alt", ""]),
    ("'$A' \\$A \"\\$A\" \"a\\b\"", ["$A", "$A", "$A", "a\\b"]),
    ("${UNSET:-${A}z}", ["xz"]),
    ("  spaced   words ", ["spaced", "words"]),
    ("$ alone", ["$", "alone"]),
])
def test_words_are_split_and_expanded_as_buildkit_does(text, expected):
    assert words.split(text, env=ENV, where="F:1") == expected


def test_one_word_keeps_its_blanks_and_the_escape_directive_counts():
    assert words.one('"two  words" $A', env=ENV, where="F:1") == "two  words x"
    assert words.one("c:\\dir `$A", env=ENV, where="F:1", escape="`") == "c:\\dir $A"


@pytest.mark.parametrize("text, needle", [
    ('"open', "unterminated quote"),
    ("${A", "unsupported substitution"),
    ("${A:-x", "unterminated ${"),
    ("${A#x}", "unsupported substitution"),
    ("${}", "bad substitution"),
])
def test_bad_words_are_one_line_naming_the_place(text, needle):
    with pytest.raises(BerthError, match="^F:3: ") as error:
        words.split(text, env=ENV, where="F:3")
    assert needle in str(error.value)


def _file(tmp_path, text):
    path = tmp_path / "Containerfile"
    path.write_text(text)
    return parse.read(str(path))


def test_heredocs_escape_and_continuations_come_from_buildkits_parser(tmp_path):
    parsed = _file(tmp_path, "# escape=`\nFROM base\nRUN echo a `\n  # inside\n  && echo b\n"
                             "RUN <<EOF\necho one\necho two\nEOF\n")
    assert parsed.escape == "`"
    run, heredoc = parsed.instructions[1:]
    assert run.value == ("echo a   && echo b",) and run.where.endswith("Containerfile:3")
    assert heredoc.heredocs == (parse.Heredoc("EOF", "echo one\necho two\n"),)


def test_a_foreign_frontend_is_refused(tmp_path):
    with pytest.raises(BerthError, match="Containerfile:1: syntax directive"):
        _file(tmp_path, "# syntax=example.com/frontend:1\nFROM base\n")
    assert _file(tmp_path, "# syntax=docker/dockerfile:1.7\nFROM base\n").escape == "\\"


STAGES = """\
ARG BASE=debian
ARG UNUSED
FROM $BASE AS build
RUN make
FROM alpine AS other
RUN exit 1
FROM build AS test
COPY --from=build /out /out
FROM scratch
COPY --from=test /out /
"""


def test_target_builds_only_the_stages_it_takes_from(tmp_path):
    made = plan.make(_file(tmp_path, STAGES), build_args={}, target=None)
    assert [(s.name, s.base, s.base_stage) for s in made.stages] == [
        ("build", "debian", None), ("test", "build", 0), (None, "scratch", None)]
    assert made.global_args == {"BASE": "debian"}
    made = plan.make(_file(tmp_path, STAGES), build_args={"BASE": "ubuntu"}, target="BUILD")
    assert [(s.name, s.base) for s in made.stages] == [("build", "ubuntu")]
    made = plan.make(_file(tmp_path, STAGES), build_args={}, target="build", base="my.sqsh")
    assert made.stages[0].base == "my.sqsh"


@pytest.mark.parametrize("text, needle", [
    ("RUN x\nFROM a\n", ":1: only ARG may come before the first FROM"),
    ("ARG A\n", "no FROM instruction"),
    ("FROM a AS x\nFROM b AS x\n", ":2: FROM ... AS x: a stage name must be unique"),
    ("FROM --platform=linux/arm64 a\n", ":1: FROM --platform: not supported"),
    ("FROM a\nCOPY --from=3 /x /\n", ":2: COPY --from=3: no earlier"),
    ("FROM a AS one\nCOPY --from=two /x /\nFROM b AS two\nCOPY --from=one / /\n",
     ":2: COPY --from=two: no earlier"),
    ("FROM a\nCOPY --link x /\n", ":2: COPY --link: not supported"),
    ("FROM a\nMAINTAINER me\n", ":2: MAINTAINER: not supported"),
    ("FROM a\nONBUILD MAINTAINER me\n", ":2: ONBUILD MAINTAINER: not a trigger"),
    ("FROM a\nENV\n", ":2: ENV needs arguments"),
    ("FROM a\nSHELL sh -c\n", ":2: SHELL takes the JSON form only"),
])
def test_what_the_plan_refuses_names_file_and_line(tmp_path, text, needle):
    with pytest.raises(BerthError, match="Containerfile") as error:
        plan.make(_file(tmp_path, text), build_args={}, target=None)
    assert needle in str(error.value)


def test_a_name_that_is_no_stage_is_an_image_planned_once(tmp_path):
    text = ("FROM a AS one\nCOPY --from=tools.io/t:1 /x /\nFROM one\n"
            "RUN --mount=type=bind,from=tools.io/t:1,target=/t --mount=type=cache,target=/c "
            "true\nRUN --mount=from=one,target=/o true\n")
    made = plan.make(_file(tmp_path, text), build_args={}, target=None)
    assert [(s.index, s.name, s.base, s.steps) for s in made.stages][0] == (
        2, "tools.io/t:1", "tools.io/t:1", [])
    assert [(s.index, s.name) for s in made.stages[1:]] == [(0, "one"), (1, None)]


def test_an_unknown_target_is_named(tmp_path):
    with pytest.raises(BerthError, match="--target nope: no stage"):
        plan.make(_file(tmp_path, STAGES), build_args={}, target="nope")


def test_a_source_swapped_for_a_link_or_fifo_after_the_walk_is_not_read(tmp_path):
    """The context's owner may change it while the build runs: what the
    walk found as a file is opened without following a link or blocking."""
    from berth.build import context
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx/file").write_text("mine\n")
    sources = context.gather(["file"], context=str(tmp_path / "ctx"), where="F:2")
    (tmp_path / "ctx/file").unlink()
    (tmp_path / "ctx/file").symlink_to("/etc/passwd")
    with pytest.raises(BerthError, match="changed during the build"):
        context.checksum(sources)
    (tmp_path / "ctx/file").unlink()
    os.mkfifo(tmp_path / "ctx/file")
    with pytest.raises(BerthError, match="no longer a regular file"):
        context.checksum(sources)


@pytest.mark.parametrize("image, uri", [
    ("debian:12", "docker://debian:12"),
    ("library/debian", "docker://library/debian"),
    ("nvcr.io/nvidia/pytorch:24.01-py3", "docker://nvcr.io#nvidia/pytorch:24.01-py3"),
    ("127.0.0.1:5000/test/busybox:v1", "docker://127.0.0.1:5000#test/busybox:v1"),
    ("localhost/app", "docker://localhost#app"),
    ("nvcr.io#nvidia/pytorch", "docker://nvcr.io#nvidia/pytorch"),
    ("docker://quay.io#x/y", "docker://quay.io#x/y"),
])
def test_a_from_image_is_a_registry_uri_by_dockers_rule(image, uri):
    from berth.build import base
    assert base.registry_uri(image) == uri


@pytest.mark.parametrize("flag, expected", [
    ("--mount=type=cache,target=/root/.cache", runflags.RunMount(
        kind="cache", target="/root/.cache", cache_id="/root/.cache", writable=True)),
    ("--mount=type=cache,dst=var/cache/,id=apt,sharing=locked,mode=0700,uid=0,ro",
     runflags.RunMount(kind="cache", target="/var/cache", cache_id="apt", sharing="locked",
                       mode=0o700, writable=False)),
    ("--mount=target=/src", runflags.RunMount(kind="bind", target="/src")),  # bind by default
    ('--mount=type=bind,"src=a,b",from=build,destination=/s,rw=true', runflags.RunMount(
        kind="bind", target="/s", source="a,b", origin="build", writable=True)),
    ("--mount=type=tmpfs,target=/t,size=1M", runflags.RunMount(kind="tmpfs", target="/t",
                                                              size=1 << 20)),
])
def test_run_mounts_read_buildkits_fields(flag, expected):
    assert runflags.read([flag, "--network=none"], "F:1") == runflags.RunFlags(
        network="none", mounts=(expected,))


@pytest.mark.parametrize("flags, needle", [
    (["--mount=type=secret,id=token"], "F:1: RUN --mount=type=secret: not supported"),
    (["--mount=type=volume,target=/v"], "type=volume: expected bind, cache or tmpfs"),
    (["--mount=type=cache"], "needs a target"),
    (["--mount=type=bind,target=/"], "a mount over / is not allowed"),
    (["--mount=type=cache,target=/c,mode=9"], "mode=9: expected an octal mode"),
    (["--mount=type=cache,target=/c,gid=5"], "gid=5: berth build maps one uid"),
    (["--mount=type=bind,target=/c,ro=maybe"], "ro=maybe: expected true or false"),
    (["--mount=type=tmpfs,target=/c,size=big"], "size=big: expected a size"),
    (["--mount=target=/a", "--mount=type=tmpfs,target=/a/"], "two mounts at one target"),
    (["--network=bridge"], "RUN --network=bridge: expected default, host or none"),
])
def test_bad_run_flags_are_refused_naming_the_line(flags, needle):
    with pytest.raises(BerthError, match="^F:1: ") as raised:
        runflags.read(flags, "F:1")
    assert needle in str(raised.value)


def test_the_stages_a_run_mounts_are_needed_by_its_stage():
    assert runflags.stages_named(["--mount=type=bind,from=tools,target=/t",
                                  "--mount=type=cache,target=/c", "--network=none"]) == ["tools"]


@pytest.mark.parametrize("text, nanoseconds", [
    ("0", 0), ("30s", 30_000_000_000), ("1m30s", 90_000_000_000), ("1.5h", 5_400_000_000_000),
    ("500ms", 500_000_000), ("10us", 10_000), ("2h45m", 9_900_000_000_000), ("+5s", 5 * 10**9),
    ("5", None), ("-5s", None), ("s", None), ("1d", None), ("", None), ("1s2", None),
])
def test_healthcheck_durations_are_gos(text, nanoseconds):
    assert recorded.go_duration(text) == nanoseconds


def test_without_the_dockerfile_package_a_build_fails_in_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dockerfile", None)  # what a venv without it imports
    path = tmp_path / "Containerfile"
    path.write_text("FROM scratch\n")
    with pytest.raises(BerthError) as e:
        parse.read(str(path))
    assert "\n" not in str(e.value)
    assert "needs the Python package 'dockerfile'" in str(e.value)
    assert "container_runtime_build: true" in str(e.value)
