#!/usr/bin/env python3
"""Benchmark `berth import` against skopeo + tar + mksquashfs, same image,
same local registry, same run. Run by hand (not a test):

    PYTHONPATH=runtime python bench/runtime_import.py [--temp DIR] [DIR ...]

Each DIR (default: two host directories) becomes one gzip layer of the
image. --temp is where both berth and tar unpack (ENROOT_TEMP_PATH; try a
tmpfs). Prints one table; the target is a warm import (all layers cached)
under 1.2x the bare mksquashfs of the same root.
"""

import argparse
import io
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime" / "tests"))
from registry_fixture import Registry, berth_env, gzipped  # noqa: E402

from berth import config  # noqa: E402

DEFAULT_DIRS = ["/usr/lib/python3.11", "/usr/share/perl"]


def layer_of(directory):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.add(directory, arcname=directory.lstrip("/"))
    return gzipped(out.getvalue())


def timed(command, **kwargs):
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, **kwargs)
    return time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temp", default=tempfile.gettempdir(),
                        help="where images are unpacked (default: %(default)s)")
    parser.add_argument("dirs", nargs="*", default=DEFAULT_DIRS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="berth-bench-"))
    unpack = Path(tempfile.mkdtemp(prefix="berth-bench-", dir=args.temp))
    registry = Registry(work)
    try:
        layers = [layer_of(d) for d in args.dirs]
        registry.push_image("bench/image", "v1", layers)
        uri = f"docker://{registry.host}#bench/image:v1"
        squash_options = shlex.split(config.load()["ENROOT_SQUASH_OPTIONS"])
        env = berth_env(work, ENROOT_SQUASH_OPTIONS=" ".join(squash_options),
                        ENROOT_MAX_PROCESSORS=str(os.cpu_count()), ENROOT_TEMP_PATH=str(unpack))
        berth = [sys.executable, "-m", "berth.cli", "--quiet", "import"]
        rows = [
            ("berth import, cold cache", timed([*berth, "-o", "cold.sqsh", uri],
                                               env=env, cwd=work)),
            ("berth import, warm cache", timed([*berth, "-o", "warm.sqsh", uri],
                                               env=env, cwd=work)),
        ]
        copy = timed(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                      f"docker://{registry.host}/bench/image:v1", f"oci:{work / 'oci'}:v1"])
        root = unpack / "root"
        root.mkdir()
        blobs = [work / "oci/blobs/sha256" / registry.push_blob("bench/image", layer)[7:]
                 for layer in layers]
        untar = sum(timed(["tar", "-xzf", str(blob), "-C", str(root)]) for blob in blobs)
        squash = timed(["mksquashfs", str(root), str(work / "bare.sqsh"), "-noappend",
                        *squash_options, "-processors", str(os.cpu_count()), "-no-progress"])
        rows += [
            ("skopeo copy", copy),
            ("tar -x of the layers", untar),
            ("mksquashfs (bare)", squash),
            ("skopeo + tar + mksquashfs", copy + untar + squash),
        ]
        size = sum(len(layer) for layer in layers)
        print(f"image: {len(layers)} gzip layers, {size / 1e6:.1f} MB compressed, "
              f"squash options: {' '.join(squash_options)}, {os.cpu_count()} CPUs, "
              f"unpacked in {args.temp}")
        print(f"{'step':<28} {'seconds':>8} {'x bare mksquashfs':>18}")
        for name, seconds in rows:
            print(f"{name:<28} {seconds:8.2f} {seconds / squash:18.2f}")
    finally:
        registry.stop()
        subprocess.run(["rm", "-rf", str(work), str(unpack)], check=True)


if __name__ == "__main__":
    main()
