#!/usr/bin/env python3
"""A new tag of a big image: what its import and start cost against the
first tag's, one run.

    /opt/berth-dev/venv/bin/python bench/new_tag.py [--size-mb 1024]
        [--layers 20] [--changed-mb 10] [--runs 3] [--starts 10] [--temp DIR]

Pushes two tags to a local docker-registry: v1, a busybox root and LAYERS-1
layers of SIZE-MB in all (files of random and repeated bytes, so that
compression has work to do), and v2, the same lower layers and a new top
layer of CHANGED-MB. Then, with berth's default squash options, median of
RUNS runs each from an image cache without images (the layers downloaded
once before):

  import --cache-only v1      the whole image (what every new tag cost before)
  import --cache-only v2      with v1 cached: only its new layer is unpacked
                              and squashed (the image kept as parts)
  mksquashfs of v2's top      the floor: a bare mksquashfs of the new layer's files
  import -o v2                the whole image as a plain squashfs (for reference)

and `berth start IMAGE true`, median of STARTS, of v2 kept as parts against
the same image as one squashfs (imported with -o). Target: the new tag's
import at most 0.2x the whole image's; its start within 30 ms of the plain
squashfs's, whatever the number of layers. Everything lives in a temporary
directory, removed at the end.
"""

import argparse
import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "runtime"), str(REPO / "runtime" / "tests")]
from registry_fixture import Registry  # noqa: E402
from runtime import busybox_layer  # noqa: E402 (bench/runtime.py's: a root that runs `true`)

from berth import config  # noqa: E402
from berth.image.imageconfig import goarch  # noqa: E402

IMPORT_TARGET = 0.2  # x the whole image's import
START_TARGET_MS = 30  # over the plain squashfs's start


def files_layer(seed, size, prefix):
    """A gzip layer of about `size` bytes of files under `prefix`: each half
    random, half a repeated line, 1 MiB or less."""
    rng = random.Random(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in ("opt", f"opt/{prefix}"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        written, number = 0, 0
        while written < size:
            length = min(rng.randint(4 << 10, 1 << 20), size - written)
            data = rng.randbytes(length // 2) + b"berth bench line\n" * (length // 34 + 1)
            data = data[:length]
            info = tarfile.TarInfo(f"opt/{prefix}/file{number}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            written, number = written + length, number + 1
    return _gzip(out.getvalue())


def _gzip(data):
    return subprocess.run(["gzip", "-1", "-n"], input=data, capture_output=True,
                          check=True).stdout


def run(command, env, expect=None):
    """Seconds `command` took, and its stdout; `expect`: text its stderr must hold."""
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0 or (expect and expect not in result.stderr):
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}\n{result.stderr}")
    return seconds, result.stdout


def berth_env(top, temp):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(top),
           "PYTHONPATH": str(REPO / "runtime"), "ENROOT_TEMP_PATH": str(temp),
           "ENROOT_ALLOW_HTTP": "yes", "ENROOT_MAX_PROCESSORS": str(os.cpu_count())}
    for key in ("SYSCONF", "CONFIG", "CACHE", "DATA", "RUNTIME"):
        env[f"ENROOT_{key}_PATH"] = str(top / key.lower())
    env["ENROOT_SQUASH_OPTIONS"] = config.load(env)["ENROOT_SQUASH_OPTIONS"]
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--changed-mb", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--temp", help="where berth unpacks (ENROOT_TEMP_PATH)")
    args = parser.parse_args()
    berth = [sys.executable, "-m", "berth.cli"]
    top = Path(tempfile.mkdtemp(prefix="bench-new-tag-"))
    registry = None
    try:
        print(f"making {args.layers} layers of {args.size_mb} MiB in all...", file=sys.stderr)
        each = (args.size_mb << 20) // max(args.layers - 1, 1)
        lower = [busybox_layer()] + [files_layer(n, each, f"layer{n}")
                                     for n in range(1, args.layers)]
        new_top = files_layer(10_000, args.changed_mb << 20, "changed")
        (top / "registry").mkdir()
        registry = Registry(top / "registry")
        config_blob = {"architecture": goarch(), "os": "linux",
                       "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}}
        registry.push_image("bench/app", "v1", lower, config_blob)
        registry.push_image("bench/app", "v2", lower[:-1] + [new_top], config_blob)
        uri = f"docker://{registry.host}#bench/app"
        temp = Path(args.temp or top / "temp")
        temp.mkdir(parents=True, exist_ok=True)
        env = berth_env(top, temp)
        images = top / "cache" / "images"
        samples = {"whole": [], "new tag": [], "floor": [], "plain": []}
        for tag in ("v1", "v2"):  # the layers downloaded once: every run unpacks them
            run([*berth, "--quiet", "import", "--cache-only", f"{uri}:{tag}"], env)
        entry = plain = None
        for _ in range(args.runs):
            shutil.rmtree(images, ignore_errors=True)
            shutil.rmtree(top / "cache" / "uris", ignore_errors=True)
            seconds, _ = run([*berth, "--quiet", "import", "--cache-only", f"{uri}:v1"], env)
            samples["whole"].append(seconds)
            seconds, out = run([*berth, "import", "--cache-only", f"{uri}:v2"], env,
                               expect="layers are in")
            samples["new tag"].append(seconds)
            entry = out.strip()
            plain = top / "plain.sqsh"
            plain.unlink(missing_ok=True)
            seconds, _ = run([*berth, "--quiet", "import", "-o", str(plain), f"{uri}:v2"], env)
            samples["plain"].append(seconds)
            samples["floor"].append(floor(new_top, temp, env))
        starts = {"parts": [], "plain": []}
        for _ in range(args.starts):  # in turns
            for name, image in (("parts", entry), ("plain", str(plain))):
                starts[name].append(run([*berth, "start", image, "true"], env)[0])
        report(args, samples, starts)
    finally:
        if registry is not None:
            registry.stop()
        subprocess.run(["rm", "-rf", str(top)], check=False)


def floor(layer, temp, env):
    """A bare mksquashfs of the new layer's files, berth's options."""
    root, image = temp / "floor-root", temp / "floor.sqsh"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    subprocess.run(["tar", "-xzf", "-", "-C", str(root)], input=layer, check=True)
    started = time.perf_counter()
    subprocess.run(["mksquashfs", str(root), str(image), "-noappend", "-all-root",
                    "-no-progress", *env["ENROOT_SQUASH_OPTIONS"].split(), "-processors",
                    env["ENROOT_MAX_PROCESSORS"]], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    shutil.rmtree(root)
    image.unlink()
    return seconds


def report(args, samples, starts):
    median = {name: statistics.median(values) for name, values in samples.items()}
    whole = median["whole"]
    print(f"\nnew tag of a {args.size_mb} MiB image of {args.layers} layers, top layer "
          f"changed by {args.changed_mb} MiB (median of {args.runs})")
    print(f"{'':<34} {'seconds':>8} {'x whole':>8}")
    for name, label in (("whole", "import --cache-only v1 (whole)"),
                        ("new tag", "import --cache-only v2 (new tag)"),
                        ("floor", "bare mksquashfs of v2's top"),
                        ("plain", "import -o v2 (plain squashfs)")):
        print(f"{label:<34} {median[name]:>8.2f} {median[name] / whole:>8.3f}")
    ratio = median["new tag"] / whole
    print(f"target: new tag <= {IMPORT_TARGET}x whole: "
          f"{'met' if ratio <= IMPORT_TARGET else 'MISSED'} ({ratio:.3f})")
    ms = {name: statistics.median(values) * 1000 for name, values in starts.items()}
    print(f"\nberth start IMAGE true (median of {args.starts}, in turns)")
    for name, label in (("plain", "v2 as one squashfs"), ("parts", "v2 as parts")):
        spread = f"{min(starts[name]) * 1000:.0f}-{max(starts[name]) * 1000:.0f}"
        print(f"{label:<34} {ms[name]:>8.0f} ms  ({spread})")
    extra = ms["parts"] - ms["plain"]
    print(f"target: parts within {START_TARGET_MS} ms of one squashfs: "
          f"{'met' if extra <= START_TARGET_MS else 'MISSED'} ({extra:+.0f} ms)")


if __name__ == "__main__":
    main()
