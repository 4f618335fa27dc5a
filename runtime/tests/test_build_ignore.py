"""berth build's ignore files, without a build: the cases Docker's
documentation gives for .dockerignore patterns, which file of several is
read, and a bad file refused in one line naming its line (unit tier)."""

import os
import sys

import pytest

from berth.build import ignore
from berth.errors import BerthError


def _ignore(tmp_path, text):
    (tmp_path / ".dockerignore").write_text(text)
    return ignore.load(str(tmp_path / ".dockerignore"))


@pytest.mark.parametrize("patterns, name, left_out", [
    ("*/temp*", "somedir/temporary.txt", True),   # one level below the root only
    ("*/temp*", "somedir/temp", True),
    ("*/temp*", "temporary.txt", False),
    ("*/temp*", "a/b/temporary.txt", False),
    ("*/*/temp*", "somedir/subdir/temporary.txt", True),
    ("temp?", "tempa", True),
    ("temp?", "dir/tempa", False),
    ("**/*.go", "a/b/c.go", True),
    ("**/*.go", "c.go", True),                     # `**` matches no directory too
    ("*.md\n!README.md", "README.md", False),
    ("*.md\n!README.md", "notes.md", True),
    ("*.md\n!README*.md\nREADME-secret.md", "README-secret.md", True),  # the last match wins
    ("*.md\n!README*.md\nREADME-secret.md", "README-x.md", False),
    ("*.md\nREADME-secret.md\n!README*.md", "README-secret.md", False),
    ("/foo/bar", "foo/bar", True),                 # the leading '/' goes
    ("./foo/../bar/", "bar/inside", True),         # cleaned; a directory's contents go with it
    ("# comment\n", "# comment", False),
    ("  spaced  ", "spaced", True),                # blanks around a pattern go
    ("[^a]x", "bx", True),                         # Go's negated class
    ("[^a]x", "ax", False),
    ("a\\*b", "a*b", True),                        # an escaped '*'
    ("a\\*b", "axb", False),
    ("dir\n!dir/keep", "dir/keep", False),
    ("dir\n!dir/keep", "dir/other", True),
])
def test_patterns_follow_dockers_rules(tmp_path, patterns, name, left_out):
    assert _ignore(tmp_path, patterns).excludes(name) is left_out


def test_an_excluded_directory_is_walked_only_where_an_exception_may_keep_something(tmp_path):
    assert _ignore(tmp_path, "dir\n!dir/keep\n").may_keep_under("dir")
    assert not _ignore(tmp_path, "dir\n").may_keep_under("dir")


def test_the_containerfiles_own_ignore_file_then_containerignore_then_dockerignore(tmp_path):
    file = str(tmp_path / "Build.file")
    assert ignore.find(str(tmp_path), file) is None
    for name in (".dockerignore", ".containerignore", "Build.file.dockerignore"):
        (tmp_path / name).write_text(name)
        assert ignore.find(str(tmp_path), file).file == str(tmp_path / name)


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.write_text("ok\n[a\n"), ".dockerignore:2: Invalid ignore pattern '[a'"),
    (lambda p: p.write_text("!\n"), ".dockerignore:1: Invalid ignore pattern '!'"),
    (lambda p: p.symlink_to("/etc/hostname"), "cannot read the ignore file"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.write_bytes(b"\xff\n"), "not UTF-8 text"),
])
def test_a_bad_ignore_file_is_refused_naming_it(tmp_path, make, needle):
    make(tmp_path / ".dockerignore")
    with pytest.raises(BerthError, match="^" + str(tmp_path)) as raised:
        ignore.find(str(tmp_path), str(tmp_path / "Containerfile"))
    assert needle in str(raised.value) and "\n" not in str(raised.value)


def test_without_its_matcher_package_an_ignore_file_fails_in_one_line_naming_it(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "e2b_dockerfile_utils", None)  # a venv without it
    (tmp_path / ".dockerignore").write_text("*.log\n")
    with pytest.raises(BerthError) as e:
        ignore.load(str(tmp_path / ".dockerignore"))
    assert str(e.value).startswith(f"{tmp_path}/.dockerignore: reading it needs the Python "
                                   "package 'e2b-dockerfile-utils'")
    assert "\n" not in str(e.value) and "container_runtime_build: true" in str(e.value)
