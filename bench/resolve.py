#!/usr/bin/env python3
"""berth import --resolve (the SPANK plugin's once per job) now and at a baseline revision.

    /opt/berth-dev/venv/bin/python bench/resolve.py [--runs N] [--baseline REV]

Pushes one image to a local docker-registry, then times `berth import
--resolve` of its tag, median of N runs, interleaved: against the registry
as it is (anonymous: the manifest alone) and behind a proxy asking for a
Bearer token (the manifest refused, the token, the manifest), with the working
tree's berth and with REV's (default HEAD~1), each installed as deployed (a
venv of /usr/bin/python3 with the system's site packages, byte-compiled),
against `berth version` of the working tree: the interpreter and the CLI, the
floor of any berth command. Also counts the modules each resolve loads.
Target: a resolve within 75 ms of the floor (half of the +150 ms a user's
first cached step may cost over a bare step).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "runtime" / "tests")]
from registry_fixture import Proxy, Registry, gzipped, layer_tar  # noqa: E402

TARGET_MS = 75  # over `berth version`


def install(source, venv):
    """berth from `source` (a runtime/ directory) in a venv of its own, as deployed."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--no-build-isolation", "--no-cache-dir",
                    "--disable-pip-version-check", str(source)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "compileall", "-q", str(venv / "lib")],
                   check=True)
    return str(venv / "bin/berth")


def revision_source(top, revision):
    """REV's runtime/ unpacked under `top`."""
    target = top / "baseline"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "runtime"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "runtime"


def working_source(top):
    target = top / "now"
    shutil.copytree(REPO / "runtime", target, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "build", "*.egg-info", "tests"))
    return target


def timed(command, env, expect):
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0 or not result.stdout.startswith(expect):
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}\n{result.stderr}")
    return seconds


def modules_loaded(berth, env, uri):
    """How many modules a resolve imports (python -X importtime counts them)."""
    python = str(Path(berth).parent / "python")
    result = subprocess.run([python, "-X", "importtime", "-c",
                             "import sys; from berth.cli import main; sys.exit(main())",
                             "import", "--resolve", uri], env=env, capture_output=True,
                            text=True, check=True)
    return sum(1 for line in result.stderr.splitlines() if line.startswith("import time:")) - 1


def print_table(rows):
    header = ("step", "median", "over the floor", "vs baseline", "target", "met?")
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(f"{cell:<{width}}" if i != 1 else f"{cell:>{width}}"
                        for i, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of each command")
    parser.add_argument("--baseline", default="HEAD~1",
                        help="the revision to compare with (default: %(default)s)")
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="berth-bench-resolve-"))
    registry = proxy = None
    try:
        berths = {"baseline": install(revision_source(top, args.baseline), top / "venv-base"),
                  "now": install(working_source(top), top / "venv-now")}
        (top / "registry").mkdir()
        registry = Registry(top / "registry")
        digest = registry.push_image("bench/app", "v1",
                                     [gzipped(layer_tar(("file", "a", b"a\n")))])
        proxy = Proxy(registry.url, auth="bearer", login="bench", password="secret")
        # (each resolve tries HTTPS first; the reset of that attempt is no error here)
        proxy.server.handle_error = lambda request, address: None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(top),
               "ENROOT_ALLOW_HTTP": "yes"}
        for key in ("SYSCONF", "CONFIG", "CACHE", "DATA", "RUNTIME", "TEMP"):
            env[f"ENROOT_{key}_PATH"] = str(top / key.lower())
        credentials = top / "config/.credentials"
        credentials.parent.mkdir()
        credentials.write_text(f"machine {proxy.host} login bench password secret\n")
        credentials.chmod(0o600)
        uris = {"anonymous": f"docker://{registry.host}#bench/app:v1",
                "Bearer token": f"docker://{proxy.host}#bench/app:v1"}
        commands = {("floor", ""): ([berths["now"], "version"], "")}
        for which, berth in berths.items():
            for kind, uri in uris.items():
                expect = f"docker://{uri[9:].split('#')[0]}#bench/app@{digest}"
                commands[(which, kind)] = ([berth, "import", "--resolve", uri], expect)
        samples = {key: [] for key in commands}
        for _ in range(args.runs):
            for key, (command, expect) in commands.items():
                samples[key].append(timed(command, env, expect))
        median = {key: statistics.median(values) for key, values in samples.items()}
        floor = median[("floor", "")]
        rows = [("berth version (the floor)", f"{floor * 1000:.1f} ms", "", "", "", "")]
        for kind, uri in uris.items():
            base = median[("baseline", kind)]
            for which in ("baseline", "now"):
                value = median[(which, kind)]
                over = (value - floor) * 1000
                count = modules_loaded(berths[which], env, uri)
                rows.append((f"resolve, {kind}, {which} ({count} modules)",
                             f"{value * 1000:.1f} ms", f"+{over:.1f} ms",
                             f"{value / base:.2f}x" if which == "now" else "",
                             f"<= +{TARGET_MS} ms" if which == "now" else "",
                             ("yes" if over <= TARGET_MS else "NO") if which == "now" else ""))
        print(f"baseline {args.baseline}; medians of {args.runs} runs each, interleaved; "
              f"registry on 127.0.0.1 (plain HTTP); {os.cpu_count()} CPUs")
        print_table(rows)
    finally:
        if proxy:
            proxy.stop()
        if registry:
            registry.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
