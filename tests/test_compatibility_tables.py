"""docs/compatibility.md's "Every interface, one by one" tables name every pyxis flag,
PYXIS_CONTAINER_* variable, plugstack key, enroot verb and enroot.conf key
that the plugin and the runtime know: a new one added without a word on
how it compares to pyxis or enroot fails here."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPANK_SOURCES = "\n".join(p.read_text() for p in sorted((ROOT / "spank").glob("*.c")))


def _tables():
    """{first header cell: set of backticked names in the first column}."""
    text = (ROOT / "docs" / "compatibility.md").read_text()
    section = text.split("## Every interface, one by one", 1)[1].split("\n## ", 1)[0]
    tables = {}
    for block in re.split(r"\n\s*\n", section):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if len(rows) < 3:
            continue
        header = rows[0].split("|")[1].strip()
        tables[header] = {name for row in rows[2:]
                          for name in re.findall(r"`([^`]+)`", row.split("|")[1])}
    return tables


def _runtime():
    sys.path.insert(0, str(ROOT / "runtime"))
    try:
        from berth import cli, config
    finally:
        sys.path.pop(0)
    return cli, config


def test_every_plugin_flag_is_in_the_table():
    # the spank_option table: { "name", ARGINFO, "[berth] usage", ... }
    flags = set(re.findall(r'\{ "([a-z-]+)",[^{}]*?"\[berth\]', SPANK_SOURCES))
    assert "container-image" in flags and "environment" in flags
    assert {f"--{f}" for f in flags} == _tables()["pyxis flag (`srun`, `sbatch`, `salloc`)"]


def test_every_pyxis_variable_is_in_the_table():
    names = set(re.findall(r"PYXIS_CONTAINER_[A-Z_]+", (ROOT / "spank" / "pyxis_env.c").read_text()))
    names.discard("PYXIS_CONTAINER_")  # a prefix built at run time, if any
    assert len(names) == 13, sorted(names)
    assert names == _tables()["pyxis variable"]


def test_every_plugstack_key_is_in_the_table():
    # spank/plugstack_keys.h, the keys' one table, which the parser includes
    keys = set(re.findall(r"^PLUGSTACK_KEY\((\w+),", (ROOT / "spank" / "plugstack_keys.h").read_text(),
                          re.M))
    assert "runtime_path" in keys
    assert keys == _tables()["plugstack key"]


def test_every_runtime_verb_is_in_the_table():
    cli, _ = _runtime()
    sub = next(a for a in cli.parser()._actions if a.dest == "verb")
    assert set(sub.choices) <= _tables()["enroot verb"]


@pytest.mark.parametrize("table", ["enroot verb", "`enroot.conf` key"])
def test_the_tables_name_nothing_unknown(table):
    """A name in the table must exist, or be one the table says is not supported."""
    cli, config = _runtime()
    sub = next(a for a in cli.parser()._actions if a.dest == "verb")
    known = set(sub.choices) | {"load", "bundle"} if table == "enroot verb" else \
        set(config.KEYS) | set(config.REFUSED) | _hook_variables(config)
    assert _tables()[table] <= known


def _hook_variables(config):
    return {prefix + "*" for prefix in config.HOOK_VARIABLE_PREFIXES}


def test_every_enroot_conf_key_is_in_the_table():
    _, config = _runtime()
    assert set(config.KEYS) | set(config.REFUSED) | _hook_variables(config) == \
        _tables()["`enroot.conf` key"]
