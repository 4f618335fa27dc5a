"""The reference pages (docs/reference/*.md) and the variable tables of the
roles' READMEs are made by scripts/reference.py from the code: a committed
page that differs from what the generator makes now fails here, so a table
and the code never disagree. Run `python scripts/reference.py` to remake them."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("reference", ROOT / "scripts" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _generator()
# every page the generator must make: the four reference pages and each role's README
PATHS = sorted([*(f"docs/reference/{name}.md" for name in ("roles", "enroot-conf", "plugin", "hooks")),
                *(f"roles/{role.name}/README.md" for role in (ROOT / "roles").iterdir() if role.is_dir())])


@pytest.fixture(scope="module")
def pages():
    """What the generator makes now (a ReferenceError fails each test with its line)."""
    return REFERENCE.pages()


@pytest.mark.parametrize("path", PATHS)
def test_the_committed_page_is_what_the_code_makes(path, pages):
    committed = ROOT / path
    assert path in pages
    assert committed.is_file(), f"{path} is missing: run python scripts/reference.py"
    assert committed.read_text() == pages[path], f"{path} is out of date: run python scripts/reference.py"


def test_each_page_starts_with_its_title_and_says_it_is_generated(pages):
    for path, text in pages.items():
        if path.startswith("docs/"):
            title, blank, note = text.splitlines()[:3]
            assert title.startswith("# ") and blank == "" and "scripts/reference.py" in note, path


def test_the_tables_name_everything_the_code_has(pages):
    """What the generator reads is all there is: a regular expression that
    silently matched less would leave a name out of a page."""
    config = REFERENCE._runtime_module("config")
    page = pages["docs/reference/enroot-conf.md"]
    assert all(f"| `{key}` |" in page for key in set(config.KEYS) | set(config.REFUSED))
    plugin = pages["docs/reference/plugin.md"]
    spank = "\n".join(p.read_text() for p in sorted((ROOT / "spank").glob("*.c")))
    flags = set(REFERENCE.re.findall(r'\{ "([a-z-]+)",[^{}]*?"\[berth\]', spank))
    assert len(flags) == 18 and all(f"--{flag}" in plugin for flag in flags)
    keys = REFERENCE.re.findall(r"^PLUGSTACK_KEY\((\w+),", (ROOT / "spank/plugstack_keys.h").read_text(),
                                REFERENCE.re.M)
    assert len(keys) == 10 and all(f"| `{key}` |" in plugin for key in keys)
    assert plugin.count("| `PYXIS_CONTAINER_") == 13
    hooks = pages["docs/reference/hooks.md"]
    assert all(f"## {REFERENCE.hook_name(p)}\n" in hooks for p in (ROOT / "hooks").glob("*.sh"))
    assert "`com.hooks.ssh.port`" in hooks and "`com.hooks.aws_ofi_nccl.variant`" in hooks


def test_a_variable_without_a_description_stops_the_generator(tmp_path, monkeypatch):
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: x\n    options:\n      demo_a: {type: str}\n")
    (role / "defaults/main.yml").write_text("demo_a: x\n")
    monkeypatch.setattr(REFERENCE, "ROOT", tmp_path)
    with pytest.raises(REFERENCE.ReferenceError, match="demo_a: no description"):
        REFERENCE.role_variables("demo")


def test_a_default_the_spec_and_the_role_disagree_on_stops_the_generator(tmp_path, monkeypatch):
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: x\n    options:\n"
        "      demo_a: {type: int, default: 1, description: A.}\n")
    (role / "defaults/main.yml").write_text("demo_a: 2\ndemo_b: 3\n")
    monkeypatch.setattr(REFERENCE, "ROOT", tmp_path)
    with pytest.raises(REFERENCE.ReferenceError, match="demo_b not in meta/argument_specs.yml"):
        REFERENCE.role_variables("demo")
    (role / "defaults/main.yml").write_text("demo_a: 2\n")
    with pytest.raises(REFERENCE.ReferenceError, match="demo_a: argument_specs.yml's default 1"):
        REFERENCE.role_variables("demo")


def test_a_hook_variable_without_a_description_stops_the_generator():
    with pytest.raises(REFERENCE.ReferenceError, match="BERTH_DEMO_KNOB \\(read by demo\\)"):
        REFERENCE._hook_rows("demo", ["BERTH_DEMO_KNOB"], set(), {})


def test_the_script_checks_the_committed_pages():
    """--check, what an editor or CI can run, finds nothing out of date."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts/reference.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == result.stderr == ""
