#!/usr/bin/env python3
"""Latency of `berth start` against the floors it cannot beat, in one run.

    python3 bench/runtime_start.py [--runs N] [--big-mb MB]

Builds a busybox image (Debian's busybox-static) and a copy padded with MB
of incompressible data, creates a container from the small one, then times
each command N times and prints min / median / p90 in milliseconds:
`unshare -Urm true` (the kernel's floor), `python3 -c pass` (the
interpreter's), `berth version` (the CLI's), and `berth start` of a
container and of both images, which must not differ (no unpacking).
Runs as the calling user; /dev/fuse must be usable for the image rows.
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

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
BERTH = [sys.executable, "-c", "import sys; from berth.cli import main; sys.exit(main())"]


def busybox_root(root):
    busybox = shutil.which("busybox") or "/bin/busybox"
    (root / "bin").mkdir(parents=True)
    for d in ("etc", "proc", "dev", "sys", "tmp"):
        (root / d).mkdir()
    shutil.copy(busybox, root / "bin/busybox")
    for applet in ("sh", "true"):
        (root / "bin" / applet).symlink_to("busybox")


def squash(root, image):
    subprocess.run(["mksquashfs", str(root), str(image), "-noappend", "-all-root",
                    "-no-progress", "-quiet"], check=True, stdout=subprocess.DEVNULL)


def timings(command, env, runs):
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return samples[0], statistics.median(samples), samples[int(len(samples) * 0.9) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--big-mb", type=int, default=64, help="padding of the big image")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(RUNTIME / "berth")], check=True)
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as top:
        top = Path(top)
        busybox_root(top / "small")
        squash(top / "small", top / "small.sqsh")
        shutil.copytree(top / "small", top / "big", symlinks=True)
        with open(top / "big/padding", "wb") as f:
            for _ in range(args.big_mb):
                f.write(os.urandom(1 << 20))
        squash(top / "big", top / "big.sqsh")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(RUNTIME),
               "HOME": str(top)}
        for key in ("SYSCONF", "CONFIG", "DATA", "RUNTIME"):
            env[f"ENROOT_{key}_PATH"] = str(top / key.lower())
        subprocess.run([*BERTH, "create", "-n", "bench", str(top / "small.sqsh")],
                       env=env, check=True)
        big_mb = (top / "big.sqsh").stat().st_size >> 20
        rows = [
            ("unshare -Urm true", ["unshare", "-Urm", "true"]),
            ("python3 -c pass", [sys.executable, "-c", "pass"]),
            ("berth version", [*BERTH, "version"]),
            ("berth start NAME true", [*BERTH, "start", "bench", "true"]),
            ("berth start small.sqsh true", [*BERTH, "start", str(top / "small.sqsh"), "true"]),
            (f"berth start big.sqsh ({big_mb} MB) true",
             [*BERTH, "start", str(top / "big.sqsh"), "true"]),
            ("berth start --rw small.sqsh true",
             [*BERTH, "start", "--rw", str(top / "small.sqsh"), "true"]),
        ]
        results = [(name, timings(command, env, args.runs)) for name, command in rows]
    floor = results[0][1][1]
    width = max(len(name) for name, _ in results)
    print(f"{'command':<{width}}  {'min':>7}  {'median':>7}  {'p90':>7}  {'-floor':>7}   (ms, "
          f"{args.runs} runs, {os.cpu_count()} cpus)")
    for name, (low, median, p90) in results:
        print(f"{name:<{width}}  {low:7.1f}  {median:7.1f}  {p90:7.1f}  {median - floor:7.1f}")


if __name__ == "__main__":
    main()
