#!/usr/bin/env python3
"""`berth build` against Docker's BuildKit and Charliecloud's `ch-image
build`, measured in the same run on the same Containerfiles.

    /opt/berth-dev/venv/bin/python bench/build.py WORK_DIR [--runs N] [--quick] [--temp DIR]

As root, on a host bootstrapped by scripts/bootstrap-host.sh (its Docker
daemon holds berth/node:bookworm), with Charliecloud installed by hand:
`apt-get install --no-install-recommends charliecloud-builders
charliecloud-runtime` (Debian
12's 0.31; the bench is not CI, so bootstrap does not install it). Each
build starts from berth/node:bookworm, exported once into WORK_DIR as a
tar (Charliecloud's base), a squashfs (Berth's) and an image (Docker's).
Nothing is fetched from outside 127.0.0.1 while building: WORK_DIR keeps
a Debian repository of the .debs the Containerfiles install (what `apt-get
--download-only` would add to the base, fetched once) and a directory of
wheels, both served on 127.0.0.1 by one HTTP server; every builder uses
the host's network.

The Containerfiles: `apt` (three packages from the local repository),
`pip` (pip from its own wheel, then two wheels from the local directory),
`gcc` (a two-stage C build: gcc in the first, the binary copied to a
clean second) and `files` (20 steps, each writing 400 small files).
Berth unpacks a stage's tree in ENROOT_TEMP_PATH (here on the disk of
/var/tmp); --temp DIR adds a row of berth builds with it in DIR (a
tmpfs such as /dev/shm, a node-local disk), to show what the disk costs.
Columns, the median of RUNS (--quick: one run):

  cold      an empty cache: Berth's a new ENROOT_CACHE_PATH, Docker's
            --no-cache, Charliecloud's --rebuild (each still fills its cache)
  again     the same build at once: nothing changed
  last line the last line changed: one step to run
  peak MiB  the most resident memory of the builder's own processes at
            once during the cold build, sampled every 50 ms: berth's and
            ch-image's process trees; Docker's daemon and containerd with
            their children, less what they held before the build
"""

import argparse
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import processes

PROJECT = Path(__file__).resolve().parents[1]
NODE = "berth/node:bookworm"
DOCKER = "/usr/bin/docker"  # (Debian's client: the daemon's own BuildKit)
CH_IMAGE = ["/usr/bin/python3", "/usr/bin/ch-image"]  # (Debian's python3, which has lark)
CH_ENV = {**os.environ, "USER": os.environ.get("USER", "root")}
PREFIX = "berth-bench-build"
APT_PACKAGES = ("jq", "tree", "file")
GCC_PACKAGES = ("gcc", "libc6-dev")
WHEELS = ("pip", "six", "idna")
SAMPLE_SECONDS = 0.05
LOCAL_APT = ('echo "deb [trusted=yes] http://127.0.0.1:{port}/repo ./" > /etc/apt/local.list'
             " && apt-get -o Dir::Etc::SourceList=/etc/apt/local.list"
             " -o Dir::Etc::SourceParts=/dev/null update -qq"
             " && apt-get -o Dir::Etc::SourceList=/etc/apt/local.list"
             " -o Dir::Etc::SourceParts=/dev/null install -y -qq --no-install-recommends {packages}"
             " && rm -rf /var/lib/apt/lists/* /etc/apt/local.list")


def containerfiles(port):
    """{name: (Containerfile text, its context's files)}; @BASE@ is FROM's image."""
    pip = (f"RUN python3 -c \"import urllib.request as u; u.urlretrieve("
           f"'http://127.0.0.1:{port}/wheels/{{wheel}}', '/tmp/{{wheel}}')\" && "
           f"python3 /tmp/{{wheel}}/pip install -q --no-index --break-system-packages "
           f"--find-links http://127.0.0.1:{port}/wheels/ six idna")
    files = "".join(f"RUN mkdir -p /data/{n} && for i in $(seq 400); do echo {n}.$i > "
                    f"/data/{n}/$i; done\n" for n in range(19))
    return {
        "apt": ("FROM @BASE@\nRUN " + LOCAL_APT.format(port=port, packages=" ".join(
            APT_PACKAGES)) + "\nRUN jq --version > /versions\n", {}),
        "pip": ("FROM @BASE@\n" + pip + "\nRUN python3 -c 'import six, idna' > /versions\n", {}),
        "gcc": ("FROM @BASE@ AS compile\nRUN " + LOCAL_APT.format(port=port, packages=" ".join(
            GCC_PACKAGES)) + "\nCOPY hello.c /src/\nRUN gcc -O2 -o /hello /src/hello.c\n"
            "FROM @BASE@\nCOPY --from=compile /hello /usr/local/bin/hello\n"
            "RUN hello > /versions\n",
            {"hello.c": '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'}),
        "files": ("FROM @BASE@\n" + files + "RUN ls /data | wc -l > /versions\n", {}),
    }


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode:
        raise SystemExit(f"{' '.join(map(str, command))}: exit {result.returncode}\n"
                         f"{result.stderr[-3000:]}")
    return result.stdout


def prepare(work):
    """The base as each builder takes it, the local repository and wheels: made once."""
    tar = work / "node.tar"
    if not tar.exists():
        run([DOCKER, "create", "--name", f"{PREFIX}-export", NODE])
        try:
            with open(f"{tar}.part", "wb") as out:
                subprocess.run([DOCKER, "export", f"{PREFIX}-export"], stdout=out, check=True)
        finally:
            run([DOCKER, "rm", f"{PREFIX}-export"])
        os.rename(f"{tar}.part", tar)
    root = work / "root"
    if not root.exists():
        root.mkdir()
        run(["tar", "-C", root, "-xf", tar])
    if not (work / "repo/Packages").exists():
        local_repository(work / "repo", root / "var/lib/dpkg/status")
    if not (work / "wheels").exists():
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d",
             work / "wheels.part", *WHEELS])
        os.rename(work / "wheels.part", work / "wheels")
    if not (work / "base.sqsh").exists():
        berth_base(root, work / "base.sqsh")
    run([DOCKER, "import", "-c", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
         "/sbin:/bin", "-c", 'CMD ["/bin/bash"]', tar, f"{PREFIX}-base"])
    run([*CH_IMAGE, "-s", work / "ch", "import", tar, f"{PREFIX}-base"], env=CH_ENV)


def local_repository(repo, status):
    """The .debs the Containerfiles install that the base lacks (apt's own
    answer, from the base's dpkg status), and their Packages index."""
    (repo / "partial").mkdir(parents=True, exist_ok=True)
    run(["apt-get", "install", "--download-only", "-y", "-qq", "--no-install-recommends",
         f"-o=Dir::State::status={status}", f"-o=Dir::Cache::archives={repo}",
         *APT_PACKAGES, *GCC_PACKAGES], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    (repo / "Packages").write_text(run(["dpkg-scanpackages", "-m", ".", "/dev/null"], cwd=repo))


def berth_base(root, image):
    """Berth's base: the tree with the record of Docker's image config."""
    sys.path.insert(0, str(PROJECT / "runtime"))
    from berth.image import imageconfig
    config = json.loads(run([DOCKER, "inspect", "-f", "{{json .Config}}", NODE]))
    imageconfig.write_image_config(str(root), {
        "env": config["Env"] or [], "entrypoint": config["Entrypoint"], "cmd": config["Cmd"],
        "workdir": config["WorkingDir"], "user": config["User"], "source": NODE, "digest": ""})
    run(["mksquashfs", root, image, "-noappend", "-all-root", "-quiet", "-no-progress",
         "-comp", "zstd"])


def serve(top):
    """An HTTP server of `top` on 127.0.0.1, in a thread: its port."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(top))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def pids_named(name):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    found.append(int(pid))
        except OSError:
            continue
    return found


def measured(command, *, env=None, daemon=False):
    """Run `command`: (its seconds, the peak resident bytes of the builder:
    its own tree, or with `daemon` Docker's daemons' trees over their idle)."""
    daemons = pids_named("dockerd") + pids_named("containerd") if daemon else []
    idle = processes.tree_rss(daemons) if daemon else 0
    peak = 0
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    finished = threading.Event()

    def sample():
        nonlocal peak
        while not finished.wait(SAMPLE_SECONDS):
            peak = max(peak, processes.tree_rss(daemons or [process.pid]) - idle)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out, err = process.communicate()
    finally:
        finished.set()
        sampler.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(map(str, command))}: exit {process.returncode}\n"
                         f"{out[-2000:]}{err[-3000:]}")
    return time.perf_counter() - started, peak


class Builders:
    """The three builders' commands for one context, each with its own cache."""

    def __init__(self, work, scratch, temp=None):
        self.work, self.scratch = work, scratch
        self.berth_env = {**os.environ, "PYTHONPATH": str(PROJECT / "runtime")}
        for name in ("CACHE", "TEMP", "DATA", "RUNTIME", "CONFIG", "SYSCONF"):
            path = scratch / "berth" / name.lower()
            path.mkdir(parents=True)
            self.berth_env[f"ENROOT_{name}_PATH"] = str(path)
        # (--temp: the stages' trees unpacked there, the rest as before)
        self.temp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}.", dir=temp)) if temp else None
        if self.temp:
            self.berth_env["ENROOT_TEMP_PATH"] = str(self.temp)

    def remove(self):
        shutil.rmtree(self.scratch)
        if self.temp:
            shutil.rmtree(self.temp)

    def berth(self, context, cold):
        if cold:  # (an empty step cache)
            shutil.rmtree(self.berth_env["ENROOT_CACHE_PATH"])
            os.mkdir(self.berth_env["ENROOT_CACHE_PATH"])
        return measured([sys.executable, "-m", "berth.cli", "build", "-q", "-o",
                         self.scratch / "out.sqsh", context], env=self.berth_env)

    def buildkit(self, context, cold):
        return measured([DOCKER, "build", "-q", "--network=host", *(["--no-cache"] * cold),
                         "-t", f"{PREFIX}-out", context],
                        env={**os.environ, "DOCKER_BUILDKIT": "1"}, daemon=True)

    def charliecloud(self, context, cold):
        return measured([*CH_IMAGE, "-s", self.work / "ch", "build", "--force",
                         *(["--rebuild"] * cold), "-t", f"{PREFIX}-out",
                         "-f", context / "Dockerfile", context], env=CH_ENV)


BUILDERS = (("berth build", "berth", "./base.sqsh"), ("BuildKit", "buildkit", f"{PREFIX}-base"),
            ("ch-image build", "charliecloud", f"{PREFIX}-base"))


def builders_measured(temp):
    """BUILDERS as (label, method, base, temp), with a second berth row whose
    trees are unpacked in `temp` where one is given."""
    rows = [(label, method, base, None) for label, method, base in BUILDERS]
    if temp:
        rows.insert(1, (f"berth build, trees in {temp}", "berth", "./base.sqsh", temp))
    return rows


def write_context(top, text, files, base):
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir(parents=True)
    for name, content in files.items():
        (top / name).write_text(content)
    (top / "Dockerfile").write_text(text.replace("@BASE@", base))
    return top


def measure(work, scratch, port, runs, temp=None):
    """{(case, builder): {column: [seconds or bytes]}}; `temp`: see builders_measured."""
    wheel = next(p.name for p in (work / "wheels").iterdir() if p.name.startswith("pip-"))
    results = {}
    for case, (text, files) in containerfiles(port).items():
        text = text.replace("{wheel}", wheel)
        changed = text.replace("> /versions\n", "> /versions-changed\n")
        for label, method, base, trees in builders_measured(temp):
            row = results.setdefault((case, label), {})
            for _ in range(runs):
                builders = Builders(work, scratch / f"{case}-{method}", temp=trees)
                build = getattr(builders, method)
                context = write_context(scratch / "ctx", text, files, base)
                if method == "berth":
                    shutil.copy(work / "base.sqsh", context / "base.sqsh")
                seconds, peak = build(context, True)
                row.setdefault("cold", []).append(seconds)
                row.setdefault("peak", []).append(peak)
                row.setdefault("again", []).append(build(context, False)[0])
                (context / "Dockerfile").write_text(changed.replace("@BASE@", base))
                row.setdefault("last line", []).append(build(context, False)[0])
                builders.remove()
            print(f"{case:>6} {label:<15} " + "  ".join(
                f"{k} {statistics.median(v):.1f}" for k, v in row.items() if k != "peak"),
                file=sys.stderr, flush=True)
    return results


def report(results, runs):
    commit = run(["git", "-C", PROJECT, "rev-parse", "--short", "HEAD"]).strip()
    print(f"\nberth build vs BuildKit vs ch-image build: median of {runs}, {os.cpu_count()} "
          f"cores, commit {commit}, load average {os.getloadavg()[2]:.1f} (15 minutes) at the end")
    print("| Containerfile | builder | cold s | again s | last line s | peak MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (case, label), row in results.items():
        median = {k: statistics.median(v) for k, v in row.items()}
        print(f"| {case} | {label} | {median['cold']:.1f} | {median['again']:.1f} | "
              f"{median['last line']:.1f} | {max(row['peak']) / (1 << 20):.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="kept between runs: the base, repository, wheels")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run")
    parser.add_argument("--temp", type=Path, help="also berth build with ENROOT_TEMP_PATH "
                        "in this directory (a tmpfs, a node-local disk): its own row")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    prepare(work)
    scratch = Path(tempfile.mkdtemp(prefix=f"{PREFIX}.", dir="/var/tmp"))
    try:
        report(measure(work, scratch, serve(work), runs, temp=args.temp), runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run([DOCKER, "rmi", "-f", f"{PREFIX}-out", f"{PREFIX}-base"],
                       capture_output=True, check=False)


if __name__ == "__main__":
    main()
