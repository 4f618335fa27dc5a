#!/usr/bin/env python3
"""Berth's import of a production-sized image against its floor, one run.

    /opt/berth-dev/venv/bin/python bench/import.py CACHE_DIR [--size-gib 10]
        [--files 250000] [--layers 40] [--seed 1] [--runs 3] [--temp DIR] [--quiet]
        [--quick] [--baseline REV]

The image is bench/realistic_image.py's (made under CACHE_DIR once, served
by a docker-registry on 127.0.0.1 from there). Measured on this machine,
median of RUNS each:

  download      every layer blob fetched at once (curl, as many at a time as
                ENROOT_MAX_CONNECTIONS), written to disk
  decompress    every blob decompressed (ENROOT_GZIP_PROGRAM -d), as many
                at a time as there are cores, to /dev/null
  mksquashfs    the image's final tree (Berth's squashfs, unsquashed) packed
                with the site's options (ENROOT_SQUASH_OPTIONS, -all-root,
                ENROOT_MAX_PROCESSORS), from a warm page cache
  GNU tar -x    every layer unpacked in order by tar (whiteouts left as
                files): what an unpack in C costs, for reference
  berth import  `berth import --cache-only` from an empty user cache
                (download included), and with its layers cached (what the
                unpack and squash cost alone); --quick leaves out this one
                and GNU tar (the full-size image once, in a quarter of the time)
  store         `berth store serve` of the image into an empty shared store
                (the request on its stdin, as the store's socket gives it),
                as its account (nobody); as root only
  baseline      `berth import --cache-only` from an empty user cache as the
                runtime of revision REV does it (--baseline; default: none),
                in turns with today's

The floor is the slowest of the first three stages, which could all run at
once; today's import runs them, and an unpack to disk, one after another.
For each Berth import: the peak memory of its process tree (the sum of its
processes' resident sets, sampled every 50 ms: mksquashfs's included) and
its disk high-water mark
(what the cache held before it plus the most the used space of the file
system of ENROOT_TEMP_PATH and the cache grew by, sampled with it) against
what stays after it (the squashfs and the cached layers). Everything but
CACHE_DIR lives in a temporary directory under --temp (default /var/tmp),
removed at the end; run as root, on an ext4 file system of its own there
(a sparse file on a loop device), so that no other writer counts.
"""

import argparse
import contextlib
import json
import os
import pwd
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import processes
import realistic_image

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SECONDS = 0.05
FREE_FLOOR = 0.1  # of the disk, kept free
NOBODY = pwd.getpwnam("nobody")


def main():
    # a SIGTERM unwinds: the registry stops, the file system is unmounted and removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    realistic_image.shape_arguments(parser)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--temp", default="/var/tmp", help="where the bench works")
    parser.add_argument("--quiet", action="store_true", help="the table only")
    parser.add_argument("--quick", action="store_true",
                        help="no GNU tar, no import with the layers cached (a big image once)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also the import of this revision's runtime (git archive)")
    args = parser.parse_args()
    say = (lambda line: None) if args.quiet else (
        lambda line: print(f"import bench: {line}", file=sys.stderr, flush=True))
    top = realistic_image.cached(args.cache_dir, args.size_gib, args.files, args.layers,
                                 args.seed, args.quiet)
    manifest = json.loads(realistic_image.manifest_of(top))
    layers = sorted({layer["digest"] for layer in manifest["layers"]})
    compressed = sum({layer["digest"]: layer["size"] for layer in manifest["layers"]}.values())
    # at worst at once: the cached layers, a tree, a squashfs (half of it)
    needed = compressed + 1.5 * args.size_gib * (1 << 30)
    need_room(args.temp, needed)
    registry = realistic_image.serve(top, args.quiet)
    scratch = Path(tempfile.mkdtemp(prefix="bench-import-", dir=args.temp))
    scratch.chmod(0o755)  # (the store's account goes through it)
    try:
        # (and room for the free floor the store's import keeps: at least 1 GiB)
        with own_filesystem(scratch, 2 * needed + compressed + (2 << 30)) as work:
            env = realistic_image.berth_env(work)
            samples = {}
            say(f"download: {len(layers)} blobs, {compressed >> 20} MiB")
            downloads = work / "download"
            samples["download"] = repeat(args.runs, say,
                                         lambda: download(registry, layers, downloads, env))
            say("decompress")
            samples["decompress"] = repeat(args.runs, say,
                                           lambda: decompress(downloads, layers, env))
            if not args.quick:
                say("GNU tar -x of every layer")
                order = [layer["digest"] for layer in manifest["layers"]]
                samples["tar"] = repeat(args.runs, say,
                                        lambda: gnu_tar(downloads, order, work / "tar-root"))
            remove(downloads)
            uri = f"docker://{registry.host}#{realistic_image.REPOSITORY}:{realistic_image.TAG}"
            berth = [sys.executable, "-m", "berth.cli", "--quiet", "import", "--cache-only", uri]
            cache = Path(env["ENROOT_CACHE_PATH"])

            def emptied(*paths):
                def fresh():  # what an import starts without; the directory that stays
                    remove(*paths)
                    return cache
                return fresh

            # each import: its command, environment, stdin, and what makes it fresh
            kinds = {"cold": (berth, env, None, emptied(cache))}
            if not args.quick:
                kinds["cached layers"] = (berth, env, None,
                                          emptied(cache / "images", cache / "uris"))
            if os.geteuid() == 0:  # (the store's side refuses root: it runs as nobody)
                kinds["store cold"] = store_import(work, env, uri)
            if args.baseline:
                # (with its own default ENROOT_GZIP_PROGRAM, as that revision ran)
                kinds["baseline cold"] = (berth, {
                    **{key: value for key, value in env.items() if key != "ENROOT_GZIP_PROGRAM"},
                    "PYTHONPATH": str(revision_runtime(args.baseline, scratch / "baseline"))},
                    None, emptied(cache))
            usage = {name: [] for name in kinds}
            for number in range(args.runs):
                for name, (command, command_env, stdin, fresh) in kinds.items():
                    say(f"berth import, {name} ({number + 1} of {args.runs})")
                    stays = fresh()
                    before = disk_usage(stays)
                    seconds, peak, high, out = measured(command, command_env, work, stdin)
                    if name == "cold":
                        image = out.splitlines()[0]
                    elif name == "store cold" and not out.startswith("ok "):
                        raise SystemExit(f"berth store serve answered: {out.strip()}")
                    samples.setdefault(f"berth {name}", []).append(seconds)
                    say(f"  {seconds:.1f} s, peak memory {peak >> 20} MiB")
                    usage[name].append((peak, before + high, disk_usage(stays)))
            remove(work / "store")
            say("mksquashfs of the final tree")
            tree = work / "tree"
            subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tree), image], check=True,
                           stdout=subprocess.DEVNULL)
            remove(cache)
            samples["mksquashfs"] = repeat(args.runs, say,
                                           lambda: mksquashfs(tree, work / "floor.sqsh", env))
            remove(tree)
            report(args, samples, usage, compressed)
    finally:
        registry.stop()
        remove(scratch)


def store_import(work, env, uri):
    """The shared store's import of `uri` (`berth store serve`, the request
    line on its stdin as systemd's socket would give it), as the store's
    account: nobody, owning the store and its temporary directory."""
    store, temp = work / "store", work / "store-temp"
    store_env = {**env, "BERTH_IMAGE_STORE": str(store), "BERTH_IMAGE_STORE_OWNER": "nobody",
                 "ENROOT_TEMP_PATH": str(temp), "HOME": str(temp)}
    command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
               sys.executable, "-m", "berth.cli", "store", "serve"]

    def fresh():
        remove(store, temp)
        for directory in (store, temp):
            directory.mkdir(mode=0o755)
            os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
        return store

    return command, store_env, f"{uri}\n", fresh


def revision_runtime(revision, target):
    """The runtime of git revision `revision`, unpacked in `target`."""
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "runtime"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "runtime"


def repeat(runs, say, function):
    """`function`'s seconds, `runs` times, each said as it comes."""
    seconds = []
    for _ in range(runs):
        seconds.append(function())
        say(f"  {seconds[-1]:.1f} s")
    return seconds


@contextlib.contextmanager
def own_filesystem(scratch, size):
    """A directory on an ext4 file system of its own (a sparse file in
    `scratch` on a loop device, direct I/O: no second page cache), so that
    its used space is the bench's alone; as root only, else `scratch`."""
    if os.geteuid() != 0:
        yield scratch
        return
    image, mount_point = scratch / "fs.ext4", scratch / "fs"
    subprocess.run(["truncate", "-s", str(int(size)), str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                    str(image)], check=True)
    device = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(image)],
                            capture_output=True, text=True, check=True).stdout.strip()
    try:
        mount_point.mkdir()
        # (discard: what the bench deletes is freed in the sparse file too)
        subprocess.run(["mount", "-o", "discard", device, str(mount_point)], check=True)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", str(mount_point)], check=True)
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)


def need_room(path, needed):
    st = os.statvfs(path)
    free, floor = st.f_bavail * st.f_frsize, FREE_FLOOR * st.f_blocks * st.f_frsize
    if free - needed < floor:
        raise SystemExit(f"import bench: error: {path} has {free >> 30} GiB free; this image "
                         f"needs about {int(needed) >> 30} GiB and a tenth of the disk stays "
                         "free: try --temp elsewhere or a smaller --size-gib")


def disk_usage(path):
    """Bytes the files under `path` take on disk (0 if it is not there)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def used(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def remove(*paths):
    subprocess.run(["rm", "-rf", *map(str, paths)], check=True)


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - started


def download(registry, layers, directory, env):
    """Seconds to fetch every blob, ENROOT_MAX_CONNECTIONS at a time."""
    remove(directory)
    directory.mkdir()
    base = f"{registry.url}/v2/{realistic_image.REPOSITORY}/blobs"

    def fetch(digest):
        subprocess.run(["curl", "-sSf", "-o", str(directory / digest), f"{base}/{digest}"],
                       check=True)

    with ThreadPoolExecutor(int(env["ENROOT_MAX_CONNECTIONS"])) as pool:
        return timed(lambda: list(pool.map(fetch, layers)))


def decompress(directory, layers, env):
    """Seconds to decompress every blob to /dev/null, one per core at a time."""
    def one(digest):
        with open(directory / digest, "rb") as blob:
            subprocess.run([env["ENROOT_GZIP_PROGRAM"], "-d", "-c"], stdin=blob,
                           stdout=subprocess.DEVNULL, check=True)

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return timed(lambda: list(pool.map(one, layers)))


def gnu_tar(directory, order, root):
    remove(root)
    root.mkdir()
    seconds = timed(lambda: [subprocess.run(["tar", "-xzf", str(directory / digest), "-C",
                                             str(root)], check=True) for digest in order])
    remove(root)
    return seconds


def mksquashfs(tree, image, env):
    subprocess.run(["tar", "-cf", "/dev/null", "-C", str(tree), "."], check=True)  # warm
    remove(image)
    seconds = timed(subprocess.run, ["mksquashfs", str(tree), str(image), "-noappend",
                                     "-all-root", "-no-progress",
                                     *env["ENROOT_SQUASH_OPTIONS"].split(), "-processors",
                                     env["ENROOT_MAX_PROCESSORS"]],
                    stdout=subprocess.DEVNULL, check=True)
    remove(image)
    return seconds


def measured(command, env, work, stdin=None):
    """Run `command` (`stdin` its input): its seconds, the peak resident
    memory of its process tree, the disk high-water mark over the baseline,
    and its stdout."""
    baseline = used(work)
    peak = high = 0
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    finished = threading.Event()

    def sample():
        nonlocal peak, high
        while not finished.wait(SAMPLE_SECONDS):
            peak = max(peak, processes.tree_rss([process.pid]))
            high = max(high, used(work) - baseline)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out, err = process.communicate(stdin or "")
    except BaseException:  # (SIGTERM): it stops too, so its file system can go
        process.kill()
        process.wait()
        raise
    finally:
        finished.set()
        sampler.join()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {process.returncode}\n{err}")
    return seconds, peak, high, out


def report(args, samples, usage, compressed):
    median = {name: statistics.median(values) for name, values in samples.items()}
    floor_name = max(("download", "decompress", "mksquashfs"), key=median.get)
    floor = median[floor_name]
    print(f"\nimport of a realistic image: {args.size_gib:g} GiB unpacked, {args.files} files, "
          f"{args.layers} layers, {compressed / (1 << 30):.2f} GiB gzip; median of "
          f"{args.runs}, {os.cpu_count()} cores, load average {os.getloadavg()[2]:.1f} "
          "(15 minutes) at the end")
    print(f"| {'stage':<40} | {'seconds':>8} | {'x floor':>7} |")
    print(f"| {'-' * 40} | {'-' * 8} | {'-' * 7} |")
    stages = (("download", "download every blob (curl, parallel)"),
              ("decompress", "decompress every blob (parallel)"),
              ("mksquashfs", "mksquashfs of the final tree"),
              ("tar", "GNU tar -x of every layer (reference)"),
              ("berth cold", "berth import --cache-only, empty cache"),
              ("berth cached layers", "berth import --cache-only, layers cached"),
              ("berth store cold", "berth store serve, empty store"),
              ("berth baseline cold", f"the same, empty cache, at {args.baseline}"))
    for name, label in stages:
        if name not in median:
            continue
        mark = " (floor)" if name == floor_name else ""
        print(f"| {label + mark:<40} | {median[name]:>8.1f} | {median[name] / floor:>7.2f} |")
    stage_sum = median["download"] + median["decompress"] + median["mksquashfs"]
    print(f"sum of the three stages: {stage_sum:.1f} s ({stage_sum / floor:.2f}x the floor)")
    if "berth baseline cold" in median:
        ratio = median["berth cold"] / median["berth baseline cold"]
        print(f"berth import, empty cache: {ratio:.2f}x its time at {args.baseline}")
    for name, rows in usage.items():
        peak = max(row[0] for row in rows)
        high = max(row[1] for row in rows)
        stays = statistics.median(row[2] for row in rows)
        print(f"berth import, {name}: peak memory {peak / (1 << 20):.0f} MiB; disk high-water "
              f"{high / (1 << 30):.2f} GiB, {high / max(stays, 1):.2f}x what stays "
              f"({stays / (1 << 30):.2f} GiB)")


if __name__ == "__main__":
    main()
