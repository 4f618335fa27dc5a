#!/usr/bin/env python3
"""How fast a job reads its image: a container's root against the kernel's
squashfs and the other ways to serve the same file, one run.

    /opt/berth-dev/venv/bin/python bench/read.py [CACHE_DIR] [--size-gib 0.08]
        [--files 5000] [--rounds 2] [--tasks N] [--full] [--quiet] [--commit REV]

As root (a kernel squashfs mount and dropping the page cache need it).
On a node of the demo cluster, with the image made by a first run on the
host (CACHE_DIR then holds it: the node needs no registry or busybox),
the node's python3 and tools:

    tar -c bench runtime | docker exec -i berth-cn1 sh -c \
        'mkdir -p /tmp/berth && tar -x -C /tmp/berth'
    docker cp /var/tmp/berth-bench berth-cn1:/var/tmp/
    docker exec berth-cn1 python3 /tmp/berth/bench/read.py --commit "$(git describe --always)"

(the kernel's row needs a loop device there, the cold rows a writable
/proc/sys/vm/drop_caches. The demo cluster's nodes, unprivileged
containers, have neither: there the table has warm rows only, as ratios
to the local disk, and says so. A node's packages against the kernel:
a container of its image run as scripts/test-runtime-suite.sh runs its
own, every device allowed, with /dev/loopN made).

The image is bench/realistic_image.py's (made once under CACHE_DIR,
default /var/tmp/berth-bench), imported by `berth import`, with a static
busybox appended as /bin/sh for the keeper. Its tree is read:

  berth start      in a container started as a job's is, `berth start
                   --detach IMAGE` (the SPANK plugin's start), through its
                   root as the keeper sees it (/proc/PID/root): the server
                   Berth chooses (`berth --verbose version` names it),
                   under the overlay a start stacks on it
  local disk       the tree unpacked by unsquashfs (pyxis's default)
  kernel           the kernel's squashfs on a loop device (root only: the limit)
  each FUSE server the node has: squashfuse; squashfuse with the cache
                   options Berth gives it; squashfuse_ll; and where
                   squashfuse_ll is threaded (0.5), also with -s

and on each, these reads, warm (after a run of the same) and cold (the
page cache dropped first), by one task and by TASKS concurrent ones
(default: one per core), all on the one mount, each task doing all of it:

  read     every file of the image's Python tree read whole
  open     stat and open of every file there, nothing read
  seq      the largest libraries read from start to end
  random   4 KiB reads at random offsets in them (1,000 per task)

After the table, one line on what a FUSE request costs here: stat and
open of every file of the Python tree through squashfuse_ll, its server
bound to one CPU, by a task on that CPU and by one on another (where the
process may use two). A request wakes the server, and waking an idle CPU
(on a virtual machine, a halted vCPU) can cost several times the request:
this is why FUSE rows move with the machine's load.

Each round runs every place in turn, so a busy machine hits all alike; the
table has the median of the rounds, as the kernel's seconds (the local
disk's where there is no loop device) and every other place's ratio to
them. --full takes the issue's test image (0.25
GiB, 8,000 files, 40 layers); the default, a smaller image of the same
shape (0.08 GiB, 5,000 files), ends in about 3 minutes on two cores.
"""

import argparse
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import realistic_image

from berth.image import squashserve

REPO = Path(__file__).resolve().parents[1]
PYTHON_TREE = realistic_image.SITE
LIBRARIES = 4  # the largest, for seq and random
RANDOM_READS = 1000
WORKLOADS = ("read", "open", "seq", "random")


# -- the reads ---------------------------------------------------------------------

def files_under(top):
    """Every regular file under `top`, in the order a walk finds them."""
    found = []
    for directory, _, names in os.walk(top):
        found += [path for path in (os.path.join(directory, n) for n in names)
                  if os.path.isfile(path) and not os.path.islink(path)]
    return found


def read_whole(paths, _seed):
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass


def stat_open(paths, _seed):
    for path in paths:
        os.stat(path)
        os.close(os.open(path, os.O_RDONLY))


def random_reads(paths, seed):
    rng = random.Random(seed)
    descriptors = [os.open(path, os.O_RDONLY) for path in paths]
    try:
        sizes = [os.fstat(fd).st_size for fd in descriptors]
        for _ in range(RANDOM_READS):
            which = rng.randrange(len(descriptors))
            os.pread(descriptors[which], 4096, rng.randrange(max(1, sizes[which] - 4096)))
    finally:
        for fd in descriptors:
            os.close(fd)


READERS = {"read": read_whole, "open": stat_open, "seq": read_whole, "random": random_reads}


def timed_tasks(reader, paths, tasks):
    """Seconds until `tasks` forked processes have each run reader(paths)."""
    started = time.perf_counter()
    children = []
    for number in range(tasks):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                reader(paths, number)
                status = 0
            finally:
                os._exit(status)
        children.append(pid)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise SystemExit(f"read bench: {len(failed)} of {tasks} tasks failed")
    return time.perf_counter() - started


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches():
    os.sync()
    DROP_CACHES.write_text("3\n")


def can_drop_caches():
    """Whether the page cache can be dropped here (not in an unprivileged
    container, whose /proc/sys is read-only): else no cold rows."""
    return os.access(DROP_CACHES, os.W_OK)


# -- the places --------------------------------------------------------------------

class Places:
    """Every place the image is read from: name -> the root of its tree."""

    def __init__(self, image, tree, work, env):
        self.image, self.work, self.env = image, work, env
        self.roots, self.mounted, self.started = {}, [], None
        self.roots["berth start"] = self.start_detached()
        self.roots["local disk"] = tree
        try:
            self.roots["kernel"] = self.mount("kernel", ["mount", "-t", "squashfs", "-o",
                                                         "loop,ro"])
        except subprocess.CalledProcessError:  # (no loop device: a node container)
            pass  # (the reference is then the local disk, and main says so)
        self.roots["squashfuse"] = self.mount("squashfuse", ["squashfuse"])
        self.roots["squashfuse +cache"] = self.mount(
            "squashfuse-cache", ["squashfuse", "-o", squashserve.CACHE_OPTIONS])
        self.roots["squashfuse_ll"] = self.mount("squashfuse_ll", ["squashfuse_ll"])
        if squashserve.choose(False).threads:
            self.roots["squashfuse_ll -s"] = self.mount("squashfuse_ll-s", ["squashfuse_ll", "-s"])

    def start_detached(self):
        command = [sys.executable, "-m", "berth.cli", "start", "--detach", str(self.image)]
        self.started = subprocess.Popen(command, env=self.env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        line = self.started.stdout.readline()
        if not line.strip().isdigit():
            raise SystemExit(f"read bench: {shlex.join(command)} printed no pid")
        return f"/proc/{line.strip()}/root"

    def mount(self, name, command):
        point = self.work / name
        point.mkdir()
        subprocess.run([*command, str(self.image), str(point)], check=True)
        self.mounted.append(point)
        return str(point)

    @property
    def reference(self):
        """The place every other is a ratio to: the kernel's mount, the limit,
        else the unpacked tree."""
        return "kernel" if "kernel" in self.roots else "local disk"

    def close(self):
        for point in self.mounted:
            subprocess.run(["umount", str(point)], check=False)
        if self.started:
            self.started.stdin.close()
            self.started.wait()


# -- the image ---------------------------------------------------------------------

def image_of(top, env, quiet):
    """The image as a job would run it (top/read-bench.sqsh, made once):
    imported by berth, a static busybox appended as /bin/sh."""
    image = top / "read-bench.sqsh"
    if image.exists():
        return image
    registry = realistic_image.serve(top, quiet)
    partial = top / "read-bench.partial.sqsh"
    try:
        uri = f"docker://{registry.host}#{realistic_image.REPOSITORY}:{realistic_image.TAG}"
        subprocess.run([sys.executable, "-m", "berth.cli", "--quiet", "import", "-o",
                        str(partial), uri], env=env, check=True)
    finally:
        registry.stop()
    shell = top / "shell"
    (shell / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(shutil.which("busybox") or "/bin/busybox", shell / "bin/busybox")
    for applet in ("sh", "true"):
        (shell / "bin" / applet).unlink(missing_ok=True)
        (shell / "bin" / applet).symlink_to("busybox")
    subprocess.run(["mksquashfs", str(shell), str(partial), "-all-root", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    partial.rename(image)
    return image


def workload_paths(root):
    """workload -> the paths it reads under `root`."""
    python = files_under(os.path.join(root, PYTHON_TREE))
    libraries = sorted((p for p in files_under(root) if ".so." in os.path.basename(p)),
                       key=os.path.getsize, reverse=True)[:LIBRARIES]
    return {"read": python, "open": python, "seq": libraries, "random": libraries}


# -- the run -----------------------------------------------------------------------

def wake_up_cost(places):
    """(seconds on the server's CPU, seconds from another CPU) of stat_open
    over the Python tree through a squashfuse_ll of its own, bound to one
    CPU, warm; None where this process may use fewer than two CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    server_cpu, other_cpu = allowed[:2]
    root = places.mount("squashfuse_ll-bound",
                        ["taskset", "-c", str(server_cpu), "squashfuse_ll"])
    paths = workload_paths(root)["open"]
    return tuple(_warm_seconds(_pinned(stat_open, cpu), paths) for cpu in (server_cpu, other_cpu))


def _pinned(reader, cpu):
    """`reader` run on `cpu` alone."""
    def pinned(paths, seed):
        os.sched_setaffinity(0, {cpu})
        reader(paths, seed)
    return pinned


def _warm_seconds(reader, paths):
    timed_tasks(reader, paths, 1)  # warms it
    return timed_tasks(reader, paths, 1)


def measure(places, rounds, task_counts, say, *, cold_too=True):
    """(workload, cold?, tasks) -> place -> median seconds; cold rows only
    with `cold_too`."""
    paths = {place: workload_paths(root) for place, root in places.roots.items()}
    samples = {}
    for number in range(rounds):
        say(f"round {number + 1} of {rounds}")
        for place in places.roots:
            for workload in WORKLOADS:
                reader, wanted = READERS[workload], paths[place][workload]
                for tasks in task_counts:
                    timed_tasks(reader, wanted, tasks)  # warms it
                    timings = [(False, timed_tasks(reader, wanted, tasks))]
                    if cold_too:
                        drop_caches()
                        timings.append((True, timed_tasks(reader, wanted, tasks)))
                    for cold_start, seconds in timings:
                        by_place = samples.setdefault((workload, cold_start, tasks), {})
                        by_place.setdefault(place, []).append(seconds)
    return {key: {place: statistics.median(values) for place, values in by_place.items()}
            for key, by_place in samples.items()}


def print_table(results, places):
    reference = places.reference
    names = [n for n in places.roots if n != reference]
    header = ["reads", f"{reference} s", *names]
    lines = [header]
    for (workload, cold, tasks), by_place in results.items():
        base = by_place[reference]
        lines.append([f"{workload}, {'cold' if cold else 'warm'}, {tasks} task{'s' * (tasks > 1)}",
                      f"{base:.3f}", *[f"{by_place[n] / base:.2f}x" for n in names]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(line, widths, strict=True))))


def git_commit():
    """This tree's commit, or None where it is no checkout or has no git
    (a node the bench was copied to)."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return None


def describe_run(args, image, paths, *, places, cold_too):
    commit = args.commit or git_commit()
    release = platform.freedesktop_os_release().get("PRETTY_NAME", "Linux")
    python = paths["read"]
    print(f"command: {shlex.join(['bench/read.py', *sys.argv[1:]])}")
    print(f"machine: {release}, kernel {platform.release()}, {os.cpu_count()} CPUs; "
          f"commit {commit or 'unknown'}")
    print(f"image: {image.stat().st_size / 1e6:.0f} MB squashfs ({args.size_gib:g} GiB, "
          f"{args.files} files, {args.layers} layers); Python tree {len(python)} files, "
          f"{sum(map(os.path.getsize, python)) / 1e6:.1f} MB; libraries "
          f"{sum(map(os.path.getsize, paths['seq'])) / 1e6:.1f} MB; median of {args.rounds} "
          f"rounds")
    print(squashserve.describe())
    if places.reference != "kernel":
        print("reference: the local disk (no loop device here for the kernel's squashfs)")
    if not cold_too:
        print("warm rows only: the page cache cannot be dropped here")


def print_wake_up(cost, reference_seconds, reference):
    if cost is None:
        print("wake-up cost: not measured (this process may use only one CPU)")
        return
    same, other = cost
    print(f"wake-up cost: stat and open of the Python tree through squashfuse_ll bound to "
          f"one CPU: {same:.3f} s from that CPU, {other:.3f} s from another "
          f"({reference}: {reference_seconds:.3f} s)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache_dir", nargs="?", default="/var/tmp/berth-bench")
    parser.add_argument("--size-gib", type=float, default=0.08)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=os.cpu_count() or 1,
                        help="concurrent tasks besides one (default: one per core)")
    parser.add_argument("--full", action="store_true",
                        help="the issue's test image (0.25 GiB, 8,000 files, 40 layers)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--commit", help="the commit measured, where the bench runs from a "
                        "copy with no git (a node): printed with the table")
    args = parser.parse_args()
    if args.full:
        shape = realistic_image.CLUSTER_TEST_SHAPE
        args.size_gib, args.files, args.layers = shape["size_gib"], shape["files"], shape["layers"]
    if os.geteuid() != 0:
        raise SystemExit("read bench: run it as root (for the kernel's mount and drop_caches)")

    def say(line):
        if not args.quiet:
            print(f"read bench: {line}", file=sys.stderr, flush=True)

    top = realistic_image.cached(args.cache_dir, args.size_gib, args.files, args.layers,
                                 quiet=args.quiet)
    work = Path(tempfile.mkdtemp(prefix="read-bench-", dir=args.cache_dir))
    places = None
    try:
        env = realistic_image.berth_env(work)
        image = image_of(top, env, args.quiet)
        say("unpacking the tree to local disk")
        tree = work / "tree"
        subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tree), str(image)], check=True,
                       stdout=subprocess.DEVNULL)
        places = Places(image, str(tree), work, env)
        if places.reference != "kernel":
            say("no kernel squashfs mount here (no loop device): ratios to the local disk")
        cold_too = can_drop_caches()
        if not cold_too:
            say("the page cache cannot be dropped here: warm rows only")
        results = measure(places, args.rounds, sorted({1, args.tasks}), say, cold_too=cold_too)
        say("the wake-up cost of a FUSE request")
        cost = wake_up_cost(places)
        describe_run(args, image, workload_paths(places.roots[places.reference]),
                     places=places, cold_too=cold_too)
        print_table(results, places)
        print_wake_up(cost, results[("open", False, 1)][places.reference], places.reference)
    finally:
        if places:
            places.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
