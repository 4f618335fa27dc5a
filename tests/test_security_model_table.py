"""docs/security.md's "One user against the others" table states every
bound and share a user meets: each number there is the one the code uses,
and each test it names exists (a renamed test or a changed constant
without the table following fails here)."""

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))
from berth import config  # noqa: E402
from berth.image import manifests, squash, verbs  # noqa: E402
from berth.site import userdirs  # noqa: E402
from berth.store import service  # noqa: E402

BARE = {"HOME": "/", "ENROOT_SYSCONF_PATH": "/nonexistent"}  # the defaults alone


def _rows():
    text = (REPO / "docs" / "security.md").read_text()
    section = text.split("## One user against the others", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def _row(constant):
    [row] = [row for row in _rows() if f"`{constant}`" in row]
    return row


@pytest.mark.parametrize("constant, value, said", [
    ("USER_PART_SECONDS", userdirs.USER_PART_SECONDS, "killed after 30 s"),
    ("PRUNE_AS_OWNER_SECONDS", verbs.PRUNE_AS_OWNER_SECONDS, "killed after 600 s"),
    ("PER_USER_CONNECTIONS", service.PER_USER_CONNECTIONS, "4 connections per user"),
    ("REQUEST_TIMEOUT", service.REQUEST_TIMEOUT, "30 s to send a request"),
    ("IMPORTS_PER_HOUR", service.IMPORTS_PER_HOUR, "20 new images"),
    ("IMPORT_BYTES_PER_HOUR", service.IMPORT_BYTES_PER_HOUR // 2**30, "or 100 GiB an hour"),
    ("FREE_FLOOR_SHARE", squash.FREE_FLOOR_SHARE, "a tenth of the filesystem"),
    ("FREE_FLOOR_BYTES", squash.FREE_FLOOR_BYTES // 2**30, "at least 1 GiB"),
    ("UPSTREAM_CHECK_SECONDS", manifests.UPSTREAM_CHECK_SECONDS, "that answers, within 5 s"),
    ("BERTH_IMAGE_STORE_TIMEOUT", config.load(BARE).number("BERTH_IMAGE_STORE_TIMEOUT"),
     "a client waits at most 3600 s"),
])
def test_each_number_is_the_codes(constant, value, said):
    assert said in _row(constant)
    assert value == (0.1 if said.startswith("a tenth") else int(re.search(r"[0-9]+", said)[0]))


def test_each_named_test_exists():
    named = []
    for row in _rows():  # `::name` alone is in the file named before it
        last = None
        for path, name in re.findall(r"`([^`]*)::(\w+)`", row):
            last = path or last
            named.append((last, name))
    assert len(named) > 10
    for path, name in named:
        tree = ast.parse((REPO / path).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"{path}::{name} is named in the table but does not exist"


def test_each_named_test_file_exists():
    for row in _rows():
        for path in re.findall(r"`((?:runtime/|spank/|molecule/|tests/)[^`:]+)", row):
            assert (REPO / path).exists(), path


def test_the_plugins_numbers_are_its_code():
    keeper = (REPO / "spank" / "keeper.c").read_text()
    stopped_ms = int(re.search(r"#define KEEPER_STOPPED_MS (\d+)", keeper)[1])
    assert f"a keeper stopped for {stopped_ms // 1000} s" in _row("KEEPER_STOPPED_MS")
