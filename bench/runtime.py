#!/usr/bin/env python3
"""berth import, create and start against their floors, one image, one run.

    /opt/berth-dev/venv/bin/python bench/runtime.py [--temp DIR] [--runs N]
        [--import-runs M] [DIR ...]

Pushes one image to a local docker-registry: a busybox root (Debian's static
/bin/busybox) as the first layer, then each DIR (default /usr/lib/python3.11
and /usr/share/perl) as a gzip layer, so mksquashfs has real work. Installs
berth as deployed (a throwaway venv made the way library/berth_venv.py does,
not the dev editable install, whose import hook costs each start) and times
it, median of M runs (imports, create) or N runs (starts):

  berth import, cold (empty cache), with the layers cached but no cached
  squashfs (what every warm import did before the image cache), and with
  the image cached; berth create; berth start NAME true (and with Debian's
  /etc/profile in the container, read by the login shell of
  ENROOT_LOGIN_SHELL's default, and with it off) and IMAGE.sqsh true;
  berth start --detach NAME (the SPANK plugin's start) until it is ready,
  and how long it takes to go once its stdin closes; berth start IMAGE.sif
  true, the same squashfs as a SIF file's partition (made by siftool), and
  its root as an Apptainer image (an environment script in /.singularity.d);
against skopeo copy + tar -x + a bare mksquashfs of the same root, and
`unshare -Urm true` as the floor of a start. Targets: a cached import under
1.2x the bare mksquashfs; `berth start NAME true` within 50 ms of the floor;
a SIF file's start within 5 ms of the same squashfs's (no conversion).
--temp is where berth and tar unpack (ENROOT_TEMP_PATH; try a tmpfs).
Everything lives in temporary directories, removed at the end.
"""

import argparse
import hashlib
import io
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "runtime"), str(REPO / "runtime" / "tests")]
from registry_fixture import Registry, gzipped  # noqa: E402

from berth import config  # noqa: E402
from berth.image import sif  # noqa: E402
from berth.image.imageconfig import goarch  # noqa: E402

DEFAULT_DIRS = ["/usr/lib/python3.11", "/usr/share/perl"]
IMPORT_TARGET = 1.2  # x the bare mksquashfs
START_TARGET_MS = 50  # over `unshare -Urm true`
SIF_TARGET_MS = 5  # a SIF start over the same squashfs's


def install_berth(top):
    """berth in a venv of its own, as library/berth_venv.py installs it."""
    source, venv = top / "src", top / "venv"
    shutil.copytree(REPO / "runtime", source, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "build", "*.egg-info"))
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--no-build-isolation", "--no-cache-dir",
                    "--disable-pip-version-check", str(source)], check=True)
    return str(venv / "bin/berth")


def busybox_layer():
    """A root that can run `true`: busybox, its sh and true, the mount points."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in ("bin", "etc", "proc", "dev", "sys", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add(shutil.which("busybox") or "/bin/busybox", arcname="bin/busybox")
        for applet in ("sh", "true"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return gzipped(out.getvalue())


def dir_layer(directory):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.add(directory, arcname=directory.lstrip("/"))
    return gzipped(out.getvalue())


def timed(command, env=None, cwd=None, expect=None):
    """Seconds `command` took; `expect`: text its stderr must hold."""
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0 or (expect and expect not in result.stderr):
        raise SystemExit(f"{shlex.join(command)}: exit {result.returncode}\n{result.stderr}")
    return seconds


def remove(*paths):
    subprocess.run(["rm", "-rf", *map(str, paths)], check=True)


def berth_env(top, unpack):
    """Every ENROOT_* path under `top`; berth's default squash options, spelt out
    for the bare mksquashfs to use too."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(top),
           "ENROOT_TEMP_PATH": str(unpack), "ENROOT_ALLOW_HTTP": "yes",
           "ENROOT_MAX_PROCESSORS": str(os.cpu_count())}
    for key in ("SYSCONF", "CONFIG", "CACHE", "DATA", "RUNTIME"):
        env[f"ENROOT_{key}_PATH"] = str(top / key.lower())
    env["ENROOT_SQUASH_OPTIONS"] = config.load(env)["ENROOT_SQUASH_OPTIONS"]
    return env


def import_times(berth, uri, env, top, runs):
    """Medians: cold import, layers cached only (the old warm path), image cached."""
    cache, image = top / "cache", top / "image.sqsh"
    command = [berth, "import", "-o", str(image), uri]
    samples = {"cold": [], "layers": [], "cached": []}
    for _ in range(runs):
        remove(image, cache)
        samples["cold"].append(timed(command, env))
        remove(image, cache / "images")
        samples["layers"].append(timed(command, env))
        remove(image)
        samples["cached"].append(timed(command, env, expect="using the cached squashfs"))
    return {name: statistics.median(values) for name, values in samples.items()}


def baseline_times(registry, layers, unpack, top, squash_options, runs):
    """Medians of skopeo copy, tar -x of its layers and a bare mksquashfs."""
    oci, root, image = top / "oci", unpack / "root", top / "bare.sqsh"
    blobs = [oci / "blobs/sha256" / hashlib.sha256(layer).hexdigest() for layer in layers]
    samples = {"skopeo": [], "tar": [], "mksquashfs": []}
    for _ in range(runs):
        remove(oci, root, image)
        samples["skopeo"].append(timed(
            ["skopeo", "copy", "--quiet", "--src-tls-verify=false",
             f"docker://{registry.host}/bench/image:v1", f"oci:{oci}:v1"]))
        root.mkdir()
        samples["tar"].append(sum(timed(["tar", "-xzf", str(blob), "-C", str(root)])
                                  for blob in blobs))
        samples["mksquashfs"].append(timed(
            ["mksquashfs", str(root), str(image), "-noappend", "-all-root",
             *shlex.split(squash_options), "-processors", str(os.cpu_count()),
             "-no-progress"]))
    remove(oci, root, image)
    return {name: statistics.median(values) for name, values in samples.items()}


def make_sifs(image, top):
    """SIF files by siftool: of `image` as it is, and of its root made an
    Apptainer image (no image.json, an environment script in
    /.singularity.d/env, which its start runs)."""
    root = top / "apptainer-root"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(root), str(image)], check=True,
                   stdout=subprocess.DEVNULL)
    (root / "etc/berth/image.json").unlink()
    (root / ".singularity.d/env").mkdir(parents=True)
    (root / ".singularity.d/env/90-environment.sh").write_text("export BENCH=1\n")
    with_env = top / "with-env.sqsh"
    subprocess.run(["mksquashfs", str(root), str(with_env), "-noappend", "-all-root", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    remove(root)
    arch = {name: int(code) for code, name in sif.ARCHES.items()}[goarch()]  # siftool's number
    sifs = {"sif": top / "image.sif", "sif-env": top / "with-env.sif"}
    for squashfs, path in ((image, sifs["sif"]), (with_env, sifs["sif-env"])):
        subprocess.run(["siftool", "new", str(path)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["siftool", "add", str(path), str(squashfs), "--datatype", "4",
                        "--parttype", "2", "--partfs", "1", "--partarch", str(arch)],
                       check=True, stdout=subprocess.DEVNULL)
    return sifs


# Debian's /etc/profile, in a second container: what a login shell reads
PROFILE = """if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH
if [ -d /etc/profile.d ]; then
  for i in /etc/profile.d/*.sh; do
    if [ -r $i ]; then
      . $i
    fi
  done
  unset i
fi
"""


def start_times(berth, env, image, sifs, runs):
    """Medians in seconds, the commands interleaved so that load hits all alike."""
    subprocess.run([berth, "create", "-f", "-n", "bench-profile", str(image)], env=env,
                   check=True, stderr=subprocess.DEVNULL)
    profile = Path(env["ENROOT_DATA_PATH"]) / "bench-profile/etc/profile"
    profile.write_text(PROFILE)
    (profile.parent / "profile.d").mkdir(exist_ok=True)
    (profile.parent / "profile.d/bench.sh").write_text("export BENCH_PROFILE=1\n")
    no_login = {**env, "ENROOT_LOGIN_SHELL": "no"}
    commands = {"floor": ["unshare", "-Urm", "true"],
                "name": [berth, "start", "bench", "true"],
                "profile": [berth, "start", "bench-profile", "true"],
                "profile-no-login": [berth, "start", "bench-profile", "true"],
                "image": [berth, "start", str(image), "true"],
                **{name: [berth, "start", str(path), "true"] for name, path in sifs.items()}}
    samples = {name: [] for name in (*commands, "ready", "stop")}
    for _ in range(runs):
        for name, command in commands.items():
            samples[name].append(timed(command, no_login if name.endswith("-no-login") else env))
        ready, stop = detached(berth, env)
        samples["ready"].append(ready)
        samples["stop"].append(stop)
    return {name: statistics.median(values) for name, values in samples.items()}


def detached(berth, env):
    """The SPANK plugin's start: seconds until `start --detach` printed the
    keeper's pid, and from closing its stdin until it was gone."""
    command = [berth, "start", "--detach", "bench"]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    ready = time.perf_counter()
    process.stdin.close()
    code = process.wait()
    stop = time.perf_counter() - ready
    if code != 0 or not line.strip().isdigit():
        raise SystemExit(f"{shlex.join(command)}: exit {code}\n{process.stderr.read()}")
    return ready - started, stop


def seconds(value):
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def print_table(rows):
    """rows: (step, seconds, against the baseline, target, met)."""
    header = ("step", "median", "vs baseline", "target", "met?")
    lines = [header] + [(step, seconds(value), versus, target, met)
                        for step, value, versus, target, met in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(f"{cell:<{width}}" if i != 1 else f"{cell:>{width}}"
                        for i, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip())


def rows_of(imports, base, create, starts):
    squash, floor = base["mksquashfs"], starts["floor"]

    def ratio(value):
        return f"{value / squash:.2f}x mksquashfs"

    def over(value):
        return f"+{(value - floor) * 1000:.1f} ms"

    def over_sqsh(value):
        return f"+{(value - starts['image']) * 1000:.1f} ms vs IMAGE.sqsh"

    cached_met = imports["cached"] < IMPORT_TARGET * squash
    start_met = (starts["name"] - floor) * 1000 <= START_TARGET_MS
    sif_met = (starts["sif"] - starts["image"]) * 1000 <= SIF_TARGET_MS
    bare = sum(base.values())
    return [
        ("berth import, cold", imports["cold"], ratio(imports["cold"]), "", ""),
        ("berth import, layers cached, no image cache", imports["layers"],
         ratio(imports["layers"]), "", ""),
        ("berth import, image cached", imports["cached"], ratio(imports["cached"]),
         f"< {IMPORT_TARGET}x mksquashfs", "yes" if cached_met else "NO"),
        ("skopeo copy", base["skopeo"], ratio(base["skopeo"]), "", ""),
        ("tar -x of the layers", base["tar"], ratio(base["tar"]), "", ""),
        ("mksquashfs (bare)", squash, ratio(squash), "", ""),
        ("skopeo + tar + mksquashfs", bare, ratio(bare), "", ""),
        ("berth create", create, ratio(create), "", ""),
        ("unshare -Urm true (floor)", floor, "", "", ""),
        ("berth start NAME true", starts["name"], over(starts["name"]),
         f"<= +{START_TARGET_MS} ms", "yes" if start_met else "NO"),
        ("the same, with Debian's /etc/profile (login shell)", starts["profile"],
         over(starts["profile"]), "", ""),
        ("the same, ENROOT_LOGIN_SHELL=no", starts["profile-no-login"],
         over(starts["profile-no-login"]), "", ""),
        ("berth start IMAGE.sqsh true", starts["image"], over(starts["image"]), "", ""),
        ("berth start IMAGE.sif true (the same squashfs)", starts["sif"],
         over_sqsh(starts["sif"]), f"<= +{SIF_TARGET_MS} ms", "yes" if sif_met else "NO"),
        ("berth start IMAGE.sif true, an env script", starts["sif-env"],
         over_sqsh(starts["sif-env"]), "", ""),
        ("berth start --detach NAME, until ready", starts["ready"], over(starts["ready"]),
         "", ""),
        ("berth start --detach NAME, stop after EOF", starts["stop"], "", "", ""),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temp", default=tempfile.gettempdir(),
                        help="where images are unpacked (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=20, help="runs of each start")
    parser.add_argument("--import-runs", type=int, default=3,
                        help="runs of each import, create and baseline step")
    parser.add_argument("dirs", nargs="*", default=DEFAULT_DIRS)
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="berth-bench-"))
    unpack = Path(tempfile.mkdtemp(prefix="berth-bench-", dir=args.temp))
    registry = None
    try:
        berth = install_berth(top)
        layers = [busybox_layer(), *(dir_layer(d) for d in args.dirs)]
        (top / "registry").mkdir()
        registry = Registry(top / "registry")
        registry.push_image("bench/image", "v1", layers)
        env = berth_env(top, unpack)
        squash_options = env["ENROOT_SQUASH_OPTIONS"]
        uri = f"docker://{registry.host}#bench/image:v1"
        imports = import_times(berth, uri, env, top, args.import_runs)
        base = baseline_times(registry, layers, unpack, top, squash_options, args.import_runs)
        image = top / "image.sqsh"
        create = statistics.median([timed([berth, "create", "-f", "-n", "bench", str(image)],
                                          env) for _ in range(args.import_runs)])
        starts = start_times(berth, env, image, make_sifs(image, top), args.runs)
        print(f"image: busybox + {', '.join(args.dirs)} as {len(layers)} gzip layers, "
              f"{sum(map(len, layers)) / 1e6:.1f} MB compressed, squashfs "
              f"{image.stat().st_size / 1e6:.1f} MB ({squash_options}); {os.cpu_count()} "
              f"CPUs; unpacked in {args.temp}; medians of {args.import_runs} imports and "
              f"{args.runs} starts")
        print_table(rows_of(imports, base, create, starts))
        subprocess.run([berth, "remove", "-f", "bench", "bench-profile"], env=env, check=True)
    finally:
        if registry:
            registry.stop()
        remove(top, unpack)


if __name__ == "__main__":
    main()
