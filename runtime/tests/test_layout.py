"""The runtime's layout (docs/architecture/runtime.md, "Package layout"): the parts of
runtime/berth import only downward, no module imports itself round a
circle, and no module takes another's private (_x) names. Read from the
source with ast, module-level and function-level imports alike; nothing
is imported. Then what a start imports, listed by a real one (the last
test, with test_container's fixtures)."""

import ast
import pprint
import subprocess
from pathlib import Path

import pytest

from test_container import berth, images, library, usable_fuse, user  # noqa: F401 (fixtures)

BERTH = Path(__file__).resolve().parents[1] / "berth"

# The parts and their floors (0 the lowest). A module may import from its
# own part and from the parts of lower floors; two parts on one floor do not
# import each other. A part holds packages (every module below them) and
# single modules.
PARTS = {
    "ground": (0, ("berth", "berth.config", "berth.errors", "berth.safedir",
                   "berth.rootpath", "berth.syscalls", "berth.units",
                   "berth.tomlread", "berth.tomlwrite", "berth.porcelain")),
    "image": (1, ("berth.image",)),
    "container": (2, ("berth.container",)),
    "store": (2, ("berth.store",)),
    "site": (3, ("berth.site",)),
    "cli": (4, ("berth.cli",)),
}


def modules():
    """{module name: path} of every module under runtime/berth."""
    found = {}
    for path in sorted(BERTH.rglob("*.py")):
        parts = path.relative_to(BERTH.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def part_of(module):
    """(floor, part) of a module, or None when no part holds it."""
    for part, (floor, names) in PARTS.items():
        for name in names:
            if module == name or name != "berth" and module.startswith(name + "."):
                return floor, part
    return None


def imports(module, path, known):
    """(line, imported module, name or None, read) of each berth import of a
    module; `name` is what a `from X import name` takes that is no module.
    With read true, no import but a name read off an imported module
    (module.name), for the private names' test alone."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    bound = {}  # local name -> module, for attribute reads (module._x)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "berth" or alias.name.startswith("berth."):
                    found.append((node.lineno, alias.name, None, False))
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per dot past the first
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            if base != "berth" and not base.startswith("berth."):
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.append((node.lineno, f"{base}.{alias.name}", None, False))
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                else:
                    found.append((node.lineno, base, alias.name, False))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            found.append((node.lineno, bound[node.value.id], node.attr, True))
    return found


def private(name):
    return name is not None and name.startswith("_") \
        and not (name.startswith("__") and name.endswith("__"))


def graph():
    known = modules()
    return known, {module: imports(module, path, known) for module, path in known.items()}


def test_every_module_belongs_to_a_part():
    known, _ = graph()
    loose = [module for module in known if part_of(module) is None]
    assert not loose, "in no part of PARTS: " + ", ".join(loose)


def test_imports_go_only_downward():
    _, edges = graph()
    wrong = []
    for module, found in edges.items():
        here = part_of(module)
        for line, target, _, read in found:
            there = part_of(target)
            if read or here is None or there is None:
                continue  # (the test above names them)
            if there[1] != here[1] and there[0] >= here[0]:
                wrong.append(f"{module}:{line} imports {target} ({there[1]} is not below "
                             f"{here[1]})")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_taken_from_another_module():
    _, edges = graph()
    wrong = [f"{module}:{line} takes {target}.{name}"
             for module, found in edges.items() for line, target, name, _ in found
             if private(name) and target != module]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    known, edges = graph()
    follows = {module: sorted({target for _, target, _, read in found
                               if not read and target in known and target != module})
               for module, found in edges.items()}
    circles = []
    for start in sorted(follows):
        # a path from a module's imports back to itself, found depth first
        seen, stack = set(), [(start, [start])]
        while stack:
            module, way = stack.pop()
            for target in follows[module]:
                if target == start:
                    circles.append(" -> ".join([*way, start]))
                    stack.clear()
                    break
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*way, target]))
    assert not circles, "\n".join(circles)


def test_no_command_line_namespace_below_cli():
    """What crosses into the parts is a typed request (image/request.py and
    each verb's named tuple, made by cli.py): no module below cli.py imports
    argparse or makes a namespace (argparse.Namespace, types.SimpleNamespace)
    to call another with."""
    wrong = []
    for module, path in modules().items():
        if module in PARTS["cli"][1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(alias.name for alias in node.names)]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            else:
                continue
            found = {"argparse", "Namespace", "SimpleNamespace"} & set(names)
            if found:
                wrong.append(f"{module}:{node.lineno} uses {', '.join(sorted(found))}")
    assert not wrong, "\n".join(wrong)


# What `berth start IMAGE true` imports beyond what the interpreter loads by
# itself, and the SPANK plugin's `start --detach --porcelain IMAGE` as well:
# each of berth's modules, and at most these others (what Python 3.11 or 3.13
# imports for them: a module one of the two goes without stays listed). Every
# step of every job pays for each (issue 56 item 6): what only a verb or a case
# needs is imported where it is used. Growing a list needs a reason, in the
# commit that grows it: what every start does with the module. To regenerate,
# run this test on both Pythons (the venv's 3.11; scripts/test-runtime-suite.sh
# trixie for 3.13): its failure prints the start's lists as they are.
START_BERTH_MODULES = [
    "berth", "berth.config", "berth.container", "berth.container.entry",
    "berth.container.environ", "berth.container.hooks", "berth.container.launch",
    "berth.container.mounts", "berth.container.rootfs", "berth.container.seccomp",
    "berth.container.services", "berth.container.verbs", "berth.errors", "berth.image",
    "berth.image.imageconfig", "berth.image.imagefile", "berth.image.parts",
    "berth.image.reference", "berth.image.sif", "berth.image.squashserve", "berth.porcelain",
    "berth.rootpath", "berth.safedir", "berth.syscalls", "berth.units",
]
START_OTHER_MODULES = [
    "_bz2", "_collections", "_compression", "_ctypes", "_functools", "_json", "_locale",
    "_lzma", "_operator", "_sre", "_struct", "_typing", "argparse", "bz2", "collections",
    "collections.abc", "contextlib", "copyreg", "ctypes", "ctypes._endian", "enum", "errno",
    "fcntl", "fnmatch", "functools", "gettext", "grp", "itertools", "json", "json.decoder",
    "json.encoder", "json.scanner", "keyword", "locale", "lzma", "math", "operator", "pwd",
    "re", "re._casefix", "re._compiler", "re._constants", "re._parser", "reprlib", "select",
    "shlex", "shutil", "signal", "struct", "typing", "typing.io", "typing.re", "zlib",
]

# Run in place of `-m berth.cli`, with the listing's path before berth's
# arguments: the names in sys.modules are written there when berth ends, at
# its exit or at the os._exit of a --detach start (no interpreter teardown);
# a forked child's exit writes nothing. Without arguments they are written at
# once: the interpreter's own, which a start's are counted beyond.
_LISTING = """
import atexit, os, runpy, sys
listing, parent, leave = sys.argv.pop(1), os.getpid(), os._exit
def write():
    if os.getpid() == parent:
        with open(listing, "w") as f:
            f.write("\\n".join(sorted(sys.modules)))
def write_and_leave(status):
    write()
    leave(status)
if len(sys.argv) == 1:
    write()
else:
    atexit.register(write)
    os._exit = write_and_leave
    runpy.run_module("berth.cli", run_name="__main__", alter_sys=True)
"""


def _modules_at_end(berth, *args):
    """The modules loaded when `berth ARGS` ends, run as the tests run berth."""
    listing = berth.base / "modules"
    command = berth.command(*args)
    at = command.index("-m")  # "-m berth.cli"
    command[at:at + 2] = ["-c", _LISTING, str(listing)]
    result = subprocess.run(command, env=berth.env, cwd=berth.base, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return set(listing.read_text().split())


@pytest.mark.parametrize("options", [(), ("--detach", "--porcelain")])
def test_a_start_imports_only_what_a_start_uses(berth, images, options):
    command = ["true"] if not options else []  # (--detach: stdin's end stops it)
    started = (_modules_at_end(berth, "start", *options, images / "app.sqsh", *command)
               - _modules_at_end(berth))
    ours = sorted(m for m in started if m == "berth" or m.startswith("berth."))
    assert ours == START_BERTH_MODULES, (
        f"new: {sorted(set(ours) - set(START_BERTH_MODULES))}, gone: "
        f"{sorted(set(START_BERTH_MODULES) - set(ours))}; a start's modules of berth now:\n"
        + pprint.pformat(ours, compact=True, width=96))
    others = sorted(started - set(ours))
    assert set(others) <= set(START_OTHER_MODULES), (
        f"new: {sorted(set(others) - set(START_OTHER_MODULES))}; a start's other modules "
        "now:\n" + pprint.pformat(others, compact=True, width=96))


# The import's stages (image/pull.py, docs/architecture/runtime.md): each
# takes one typed value, the rest of what it needs by keyword, and gives the
# next stage's value (fetch yields it, as its downloads run on).
STAGES = {
    "resolve": ("PullRequest", "Resolved"),
    "fetch": ("Resolved", "typing.Iterator[Fetched]"),
    "pack": ("Fetched", "Packed"),
    "record": ("Packed", "CachedImage"),
    "build_cached": ("Resolved", None),
}
STAGE_VALUES = ("Resolved", "Fetched", "Target", "Packed")


def test_the_import_is_stages_of_one_typed_value_each():
    tree = ast.parse((BERTH / "image" / "pull.py").read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    wrong = []
    for name, (takes, gives) in STAGES.items():
        function = functions[name]
        given = [arg.annotation and ast.unparse(arg.annotation) for arg in function.args.args]
        if given != [takes]:
            wrong.append(f"{name} takes {given}, not one {takes} (the rest by keyword)")
        if gives and (function.returns is None or ast.unparse(function.returns) != gives):
            wrong.append(f"{name} is not annotated to give {gives}")
    for name in STAGE_VALUES:
        bases = [ast.unparse(base) for base in classes[name].bases]
        if bases != ["typing.NamedTuple"]:
            wrong.append(f"{name} is not a typed named tuple: {bases}")
    assert not wrong, "\n".join(wrong)
