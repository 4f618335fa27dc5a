"""The runtime's layout (docs/architecture/runtime.md, "Package layout"): the parts of
runtime/berth import only downward, no module imports itself round a
circle, and no module takes another's private (_x) names. Read from the
source with ast, module-level and function-level imports alike; nothing
is imported. The code's shape: functions that read in one screen, calls
that pass at most three values by position, the import's stages typed.
Then what a start imports, listed by a real one (the last test, with
test_container's fixtures)."""

import ast
import collections
import pprint
import subprocess
from pathlib import Path

import pytest

BERTH = Path(__file__).resolve().parents[1] / "berth"

# The parts and their floors (0 the lowest). A module may import from its
# own part and from the parts of lower floors; two parts on one floor do not
# import each other. A part holds packages (every module below them) and
# single modules.
PARTS = {
    "ground": (0, ("berth", "berth.config", "berth.confvalue", "berth.errors", "berth.safedir",
                   "berth.rootpath", "berth.syscalls", "berth.units",
                   "berth.tomlread", "berth.tomlwrite", "berth.porcelain")),
    "image": (1, ("berth.image",)),
    "container": (2, ("berth.container",)),
    "store": (2, ("berth.store",)),
    "build": (3, ("berth.build",)),
    "site": (4, ("berth.site",)),
    "cli": (5, ("berth.cli",)),
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


# -- functions that read in one screen, calls that name what they pass ------

LONGEST = 60  # lines of a function, its docstring and decorators not counted out


def functions():
    """(module, qualified name, node) of every function under runtime/berth."""
    for module, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        scopes = [(tree, "")]
        while scopes:
            scope, prefix = scopes.pop()
            for node in ast.iter_child_nodes(scope):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{node.name}"
                    if not isinstance(node, ast.ClassDef):
                        yield module, name, node
                    scopes.append((node, f"{name}."))


# Today's functions over LONGEST lines that give no reason in their
# docstring, outside what issue 56 split: none may join them, and one split
# leaves this list.
LONG_FUNCTIONS = {
    "berth.config:_defaults", "berth.container.mounts:apply", "berth.image.layers:_apply_member",
    "berth.image.sif:read", "berth.image.stream:squash_layers", "berth.site.userdirs:_plan",
}


def test_functions_read_in_one_screen():
    """No function over LONGEST lines, unless its docstring says why it is
    one (the words "one function") or LONG_FUNCTIONS holds it."""
    wrong = []
    for module, name, node in functions():
        length = node.end_lineno - node.lineno + 1
        reason = "one function" in (ast.get_docstring(node) or "")
        if length > LONGEST and not reason and f"{module}:{name}" not in LONG_FUNCTIONS:
            wrong.append(f"{module}:{name} is {length} lines")
    gone = LONG_FUNCTIONS - {f"{module}:{name}" for module, name, node in functions()
                             if node.end_lineno - node.lineno + 1 > LONGEST}
    assert not wrong, "\n".join(wrong)
    assert not gone, f"no longer long, so off LONG_FUNCTIONS: {sorted(gone)}"


def _callees(module, path, known):
    """(line, callee, positional count) of each call in `module` to a
    function or class of runtime/berth: a name the module defines at its top
    or takes from a berth module, module.name of a berth module it imports,
    or self.name of a method of the class around the call."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    own = {node.name for node in tree.body
           if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    own |= {target.id for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}
    taken, bound = set(), set()
    for _, target, name, read in imports(module, path, known):
        if not read:
            (taken.add(name) if name else bound.add(target.rpartition(".")[2]))
    found = []
    for scope in [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]:
        methods = {node.name for node in scope.body if isinstance(node, ast.FunctionDef)} \
            if isinstance(scope, ast.ClassDef) else set()
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or len(node.args) <= 3:
                continue
            func = node.func
            if isinstance(func, ast.Name) and scope is tree and func.id in own | taken:
                found.append((node.lineno, func.id, len(node.args)))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if scope is tree and func.value.id in bound \
                        or func.value.id == "self" and func.attr in methods:
                    found.append((node.lineno, ast.unparse(func), len(node.args)))
    return sorted(set(found))


# Today's calls of more than three positional arguments outside issue 56's
# import, by module and callee, with how many there are: none may be added,
# and one rewritten with keywords lowers its count.
POSITIONAL_CALLS = {
    "berth.container.launch:_exec_keeper": 1,
    "berth.container.mounts:Mount": 5,
    "berth.container.mounts:_exec_server": 1,
    "berth.container.mounts:mount_fuse": 1,
    "berth.container.rootfs:_mount": 11,
    "berth.container.rootfs:mounts.Mount": 1,
    "berth.container.rootfs:mounts.mount_fuse": 1,
    "berth.container.verbs:_plan": 2,
    "berth.container.verbs:config.number_in_range": 1,
    "berth.container.verbs:squash.make_squashfs": 1,
    "berth.image.layers:_apply_member": 1,
    "berth.image.layers:_apply_tar": 1,
    "berth.image.layers:read_layer": 1,
    "berth.image.reference:Reference": 1,
    "berth.image.registries:Endpoint": 1,
    "berth.image.registries:_Mirror": 1,
    "berth.image.registries:_Rule": 1,
    "berth.image.registries:_bool": 4,
    "berth.image.registries:_string": 4,
    "berth.image.registry:Patience": 1,
    "berth.image.registry:open_transport": 1,
    "berth.image.registry:self._first_get": 1,
    "berth.image.registry:self._follow": 1,
    "berth.image.registry:self._get": 4,
    "berth.image.registry:self._get_with_retries": 3,
    "berth.image.sif:Image": 1,
    "berth.image.stream:read_layer": 2,
    "berth.image.transport:_DirectResponse": 1,
    "berth.safedir:_make": 1,
    "berth.site.edf:_expand": 3,
    "berth.site.edf:_resolve": 1,
    "berth.store.local:_make_room": 1,
    "berth.store.paths:checked": 1,
}


def test_calls_pass_at_most_three_positional_arguments():
    known = modules()
    counted = collections.Counter()
    lines = collections.defaultdict(list)
    for module, path in known.items():
        for line, callee, count in _callees(module, path, known):
            counted[f"{module}:{callee}"] += 1
            lines[f"{module}:{callee}"].append(f"{line} ({count})")
    wrong = [f"{where} at line {', '.join(lines[where])}: name what it passes"
             for where, count in sorted(counted.items())
             if count > POSITIONAL_CALLS.get(where, 0)]
    fewer = {where: counted[where] for where, count in POSITIONAL_CALLS.items()
             if counted[where] < count}
    assert not wrong, "\n".join(wrong)
    assert not fewer, f"fewer now, so lower POSITIONAL_CALLS: {fewer}"


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
    "berth", "berth.config", "berth.confvalue", "berth.container", "berth.container.entry",
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
