#!/usr/bin/env python3
"""What a container costs a Slurm step, against the bare step, in one run.

    python3 bench/srun_overhead.py [--runs N] [--big-mb MB] [--login CMD] [--cold-start]
                                   [--mpi-runs N] [--mpi-only]

Runs on the demo cluster (`bash scripts/demo.sh`): commands go to the login
node through `--login` (default: docker exec into berth-ctl as alice) and the
images are those scripts/test-image.sh made, seen by the compute nodes under
/opt/berth-images. Times, N times each, min / median / p90 in ms:
  srun -N2 true                                     bare step
  srun -N2 --container-name=.. true                 named container, warm
  srun -N2 --container-image=small.sqsh true        unnamed, from a local squashfs
  srun -N2 --container-image=big.sqsh true          the same, image padded to MB
  srun -N2 --container-image=REGISTRY#IMAGE true    a registry image the nodes have in
                                                    their image cache (berth import --reuse)
  srun -N2 --container-image=REGISTRY#IMAGE@DIGEST  the same pinned by digest: no resolve of
                                                    its tag at submission, the node's part alone
  srun -N1 true, and with the warm named container,   the same on one node
    a small squashfs and the cached registry image,
    by tag and pinned
and an MPI ping-pong between the two nodes and within one (shared memory:
ranks bound to cores, Open MPI's copy through shared buffers, no CMA),
bare and in the container (latency of 8 bytes, bandwidth of 4 MiB), --mpi-runs
of each between the nodes (twice as many on one), bare and container in
turns, medians with their spread (--mpi-only: those rows alone). The steps
run in turns, one of each per round, so that the machine's changing speed hits
all alike.
With --cold-start, first steps of a registry image new to the cluster
instead: every berth cache on the nodes emptied, then alice's first
`srun -N2 --container-image=REGISTRY#IMAGE true` and bob's first step of the
same image, per node and user (no store) and with the shared image store on
/shared (a site.yml run turns it on, another off again), for the small image
and the one padded to MB: wall time, and the blob requests and bytes the
registry served (its own log); then bob's next five steps, cached (the
median), which his first step is compared with. Target: with the store,
each blob once per cluster, and bob's first step no dearer than a cached
step, and within 150 ms of a bare step.
Targets: container MPI within 2% of bare; warm step overhead under 150 ms;
unnamed step within 2x the warm one, small and big image alike. The one-node
rows tell what a node pays: on the development machines both node containers
share two cores, so in a two-node step their runtimes compete for them, which
real nodes do not.
"""

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The demo cluster's release (scripts/demo.sh, BERTH_NODE_SUITE) and its test image.
SUITE = os.environ.get("BERTH_NODE_SUITE", "bookworm")
IMAGES = Path(__file__).resolve().parents[1] / ".cache" / "images" / SUITE
SMALL = "/opt/berth-images/mpi-test.sqsh"
BIG = "/opt/berth-images/mpi-test-big.sqsh"
REGISTRY = "berth-ctl:5000#berth/mpi-test:1"  # the cluster's registry (scenario prepare)
BARE_PINGPONG = "/opt/berth-test/mpi_pingpong"
# On one node, both ranks bound to a core each, and Open MPI's shared memory
# copied through its buffers rather than by process_vm_readv (CMA), bare and
# container alike: on the development machines CMA's bandwidth swings
# between runs by more than half, bare as contained, so its medians of ten
# runs say nothing to 2 %. (Open MPI 5 names it smsc, 4.1 the vader BTL's
# single-copy mechanism; each ignores the other's.)
ONE_NODE_MPI = "OMPI_MCA_smsc=^cma OMPI_MCA_btl_vader_single_copy_mechanism=none"
CONTAINER_PINGPONG = "/opt/mpi-test/pingpong-openmpi"


def make_big_image(megabytes):
    """The test image plus MB of incompressible data, once."""
    big = IMAGES / "mpi-test-big.sqsh"
    if big.exists() and big.stat().st_size > megabytes << 20:
        return
    padding = IMAGES / "padding"
    padding.mkdir(exist_ok=True)
    with open("/dev/urandom", "rb") as source, open(padding / "random.bin", "wb") as f:
        for _ in range(megabytes):
            f.write(source.read(1 << 20))
    subprocess.run(["cp", IMAGES / "mpi-test.sqsh", big], check=True)
    # Appended to the image's root; random data does not compress.
    subprocess.run(["mksquashfs", padding, big, "-no-progress", "-quiet", "-all-root", "-noD"],
                   check=True, stdout=subprocess.DEVNULL)
    big.chmod(0o644)
    subprocess.run(["rm", "-rf", padding], check=True)


def on_login(login, command):
    result = subprocess.run([*login, "bash", "-c", command], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"srun_overhead: '{command}' failed: {result.stderr.strip()}")
    return result.stdout


def timings(login, commands, runs):
    """min / median / p90 ms of each command, run in turns: a change in the
    machine's speed during the run (steal time) then hits every row alike."""
    samples = [[] for _ in commands]
    for _ in range(runs):
        for command, times in zip(commands, samples, strict=True):
            started = time.perf_counter()
            on_login(login, command)
            times.append((time.perf_counter() - started) * 1000)
    rows = []
    for times in samples:
        times.sort()
        rows.append((times[0], statistics.median(times), times[max(int(len(times) * 0.9) - 1, 0)]))
    return rows


def pingpong(login, nodes, runs):
    """Latencies and bandwidths of `runs` runs each, bare and in the
    container, in turns (bare, container, bare, ...): {variant: (latencies,
    bandwidths)}."""
    results = {"bare": ([], []), "container": ([], [])}
    variants = (("bare", BARE_PINGPONG),
                ("container", f"--container-image={SMALL} {CONTAINER_PINGPONG}"))
    srun = f"srun -N{nodes} -n2 --mpi=pmix"
    if nodes == 1:
        srun = f"{ONE_NODE_MPI} {srun} --cpu-bind=cores"
    for _ in range(runs):
        for variant, program in variants:
            out = on_login(login, f"{srun} {program}")
            latencies, bandwidths = results[variant]
            latencies.append(float(re.search(r"latency_us (\S+)", out).group(1)))
            bandwidths.append(float(re.search(r"bandwidth_MBps (\S+)", out).group(1)))
    return results


def print_pingpong(mpi, runs):
    """Medians and spread (lowest to highest run) of each MPI row, and the
    container's median over the bare one."""
    print(f"\n{'MPI ping-pong, ' + str(runs) + ' runs each, in turns':44} "
          f"{'bare median':>12} {'(spread)':>17} {'container':>10} {'(spread)':>17} {'ratio':>7}")
    for nodes, results in mpi:
        where = "2 nodes (TCP)" if nodes == 2 else "1 node (shm, no CMA)"
        for index, label, digits in ((0, "latency, 8 B (us), ", 2),
                                     (1, "bandwidth, 4 MiB (MB/s), ", 1)):
            bare, contained = results["bare"][index], results["container"][index]
            spread = [f"({min(values):.{digits}f}-{max(values):.{digits}f})"
                      for values in (bare, contained)]
            ratio = statistics.median(contained) / statistics.median(bare)
            print(f"{label + where:44} {statistics.median(bare):12.{digits}f} {spread[0]:>17} "
                  f"{statistics.median(contained):10.{digits}f} {spread[1]:>17} {ratio:7.3f}")
    print("(target: ratios within 2% of 1; a ratio inside both spreads is the test bed's noise)")


# -- cold start: the first step of an image new to the cluster ------------------

PROJECT = Path(__file__).resolve().parents[1]
STORE = "/shared/berth/images"
BIG_REPO = "berth/mpi-test-big"
BLOB_SERVED = re.compile(r'"GET /v2/[^ ]+/blobs/sha256:[0-9a-f]{64} HTTP/[0-9.]+" 200 (\d+)')


def docker(*args):
    result = subprocess.run(["docker", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"srun_overhead: docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def push_big_image(megabytes):
    """The test image (berth/mpi-test:SUITE, which scripts/test-image.sh builds
    for scripts/demo.sh) plus a layer of MB random bytes, in the cluster's
    registry as berth/mpi-test-big:MB (once: its tag stays)."""
    tag = f"{BIG_REPO}:{megabytes}"
    probe = subprocess.run(["docker", "exec", "berth-ctl", "skopeo", "inspect",
                            "--tls-verify=false", f"docker://localhost:5000/{tag}"],
                           capture_output=True)
    if probe.returncode == 0:
        return tag
    base = f"berth/mpi-test:{SUITE}"
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        docker("load", "-q", "-i", str(IMAGES / "mpi-test.tar"))  # the same image, saved
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as work:
        Path(work, "Dockerfile").write_text(
            f"FROM {base}\nRUN head -c {megabytes}M /dev/urandom > /opt/padding\n")
        docker("build", "-q", "-t", tag, work)
        docker("save", "-o", f"{work}/big.tar", tag)
        # (/var/tmp: the node's /tmp is a tmpfs, which docker cp does not write into)
        docker("cp", f"{work}/big.tar", "berth-ctl:/var/tmp/bench-big.tar")
    docker("exec", "berth-ctl", "skopeo", "copy", "-q", "--dest-tls-verify=false",
           "docker-archive:/var/tmp/bench-big.tar", f"docker://localhost:5000/{tag}")
    docker("exec", "berth-ctl", "rm", "-f", "/var/tmp/bench-big.tar")
    return tag


def play(*args):
    """site.yml on the demo cluster (bench/site_noop.py's inventory)."""
    from site_noop import inventory
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as work:
        hosts = inventory(Path(work) / "docker", "docker")
        # (the venv's, beside this interpreter, when run as the README says)
        beside = Path(sys.executable).parent / "ansible-playbook"
        playbook = str(beside) if beside.exists() else "ansible-playbook"
        result = subprocess.run([playbook, "-i", str(hosts), "site.yml", *args],
                                cwd=PROJECT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"srun_overhead: site.yml {' '.join(args)} failed:\n"
                         f"{(result.stdout + result.stderr)[-2000:]}")


def empty_caches():
    """No image anywhere on the cluster: the store and every user's cache."""
    for name in ("berth-ctl", "berth-cn1", "berth-cn2"):
        docker("exec", name, "sh", "-c", f"rm -rf /var/lib/berth/cache/*/* {STORE}/*/*")


def served_since(mark):
    log = docker("exec", "berth-ctl", "journalctl", "-u", "docker-registry", f"--since=@{mark}",
                 "-o", "cat", "--no-pager")
    sizes = [int(size) for size in BLOB_SERVED.findall(log)]
    return len(sizes), sum(sizes)


def first_step(user, image):
    mark = int(time.time())
    time.sleep(1.1)  # the log's resolution is a second
    login = ["docker", "exec", "berth-ctl", "runuser", "-u", user, "--"]
    started = time.perf_counter()
    on_login(login, f"cd /tmp && srun -N2 --container-image={image} true")
    seconds = time.perf_counter() - started
    time.sleep(1.1)
    return (seconds, *served_since(mark))


def cached_steps(user, image, runs=5):
    """The user's next steps of the image, now cached: median s, and what
    the registry served meanwhile (nothing, if the cache holds)."""
    mark = int(time.time())
    time.sleep(1.1)
    login = ["docker", "exec", "berth-ctl", "runuser", "-u", user, "--"]
    median_ms = timings(login, [f"cd /tmp && srun -N2 --container-image={image} true"], runs)[0][1]
    time.sleep(1.1)
    return (median_ms / 1000, *served_since(mark))


def cold_start(big_mb):
    images = [("small", REGISTRY), (f"+{big_mb} MB", f"berth-ctl:5000#{push_big_image(big_mb)}")]
    login = ["docker", "exec", "berth-ctl", "runuser", "-u", "alice", "--"]
    bare = timings(login, ["srun -N2 true"], 5)[0][1] / 1000
    rows = []
    for store in (False, True):
        if store:
            play("-e", f"container_runtime_image_store={STORE}")
        try:
            for size, image in images:
                empty_caches()
                where = "store" if store else "per node"
                for user in ("alice", "bob"):
                    rows.append((size, where, user, *first_step(user, image)))
                # what the target compares bob's first step with
                rows.append((size, where, "bob's next 5 (median)", *cached_steps("bob", image)))
        finally:
            if store:
                play()
    print(f"\n{'first srun -N2 of a new image':46} {'wall s':>7} {'over bare':>10} "
          f"{'blob GETs':>10} {'MB served':>10}")
    for size, where, user, seconds, gets, served in rows:
        label = f"{size}, {where}, {user}"
        print(f"{label:46} {seconds:7.2f} {seconds - bare:+10.2f} {gets:10d} "
              f"{served / 2 ** 20:10.1f}")
    print(f"(bare srun -N2 true: {bare * 1000:.0f} ms; target with the store: each blob "
          "served once per cluster, the second user's first step no dearer than a cached "
          "step, and within 0.15 s of bare)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--big-mb", type=int, default=1024, help="padding of the big image")
    parser.add_argument("--login", default="docker exec berth-ctl runuser -u alice --",
                        help="prefix that runs a command as a user on the login node")
    parser.add_argument("--cold-start", action="store_true",
                        help="first steps of an image new to the cluster, with and without "
                             "the shared image store, instead of the warm rows")
    parser.add_argument("--mpi-runs", type=int, default=10,
                        help="runs of each MPI ping-pong, bare and in the container in turns")
    parser.add_argument("--mpi-only", action="store_true",
                        help="the MPI ping-pong rows alone")
    args = parser.parse_args()
    release = on_login(shlex.split(args.login),
                       "srun -N1 sh -c '. /etc/os-release; echo $PRETTY_NAME'; sinfo --version")
    print("nodes: " + ", ".join(release.split("\n")[:2]) + "\n")
    if args.cold_start:
        cold_start(args.big_mb)
        return
    login = shlex.split(args.login)
    # Two nodes bounce 2000 messages over TCP (seconds a run); one node's are quick.
    mpi_rows = ((2, args.mpi_runs), (1, args.mpi_runs * 2))
    if args.mpi_only:
        print_pingpong([(nodes, pingpong(login, nodes, runs)) for nodes, runs in mpi_rows],
                       args.mpi_runs)
        return
    make_big_image(args.big_mb)

    on_login(login, f"srun -N2 --container-name=bench --container-image={SMALL} true")
    on_login(login, f"srun -N2 --container-image={REGISTRY} true")  # into the image cache
    pinned = on_login(login, f"berth import --resolve docker://{REGISTRY}").strip()[9:]
    on_login(login, f"srun -N2 --container-image={pinned} true")  # its own cache entry
    steps = [
        ("srun -N2 true (bare)", "srun -N2 true"),
        ("named container, warm", "srun -N2 --container-name=bench true"),
        ("unnamed, small squashfs", f"srun -N2 --container-image={SMALL} true"),
        (f"unnamed, squashfs + {args.big_mb} MB", f"srun -N2 --container-image={BIG} true"),
        ("unnamed, registry image (cached)", f"srun -N2 --container-image={REGISTRY} true"),
        ("the same, pinned by digest", f"srun -N2 --container-image={pinned} true"),
        ("srun -N1 true (bare, one node)", "srun -N1 true"),
        ("named container, warm, one node", "srun -N1 --container-name=bench true"),
        ("unnamed, small squashfs, one node", f"srun -N1 --container-image={SMALL} true"),
        ("registry image (cached), one node", f"srun -N1 --container-image={REGISTRY} true"),
        ("the same, pinned, one node", f"srun -N1 --container-image={pinned} true"),
    ]
    measured = timings(login, [command for _, command in steps], args.runs)
    rows = [(label, *row) for (label, _), row in zip(steps, measured, strict=True)]
    bare = {"one node" in label: median for label, _, median, _ in rows if "bare" in label}
    over = {label: median - bare["one node" in label] for label, _, median, _ in rows}
    # the named step's container (pyxis_NAME) is on one node only; remove -f of a
    # missing container is an error, as in enroot
    on_login(login, "srun -N2 sh -c 'berth list | grep -qx pyxis_bench || exit 0; "
                    "berth remove -f pyxis_bench'")

    mpi = [(nodes, pingpong(login, nodes, runs)) for nodes, runs in mpi_rows]

    print(f"{'step':34} {'min ms':>8} {'median':>8} {'p90':>8} {'over bare':>10}")
    for label, low, median, p90 in rows:
        print(f"{label:34} {low:8.0f} {median:8.0f} {p90:8.0f} {over[label]:+10.0f}")
    print(f"\nwarm container overhead {over['named container, warm']:.0f} ms, "
          f"{over['named container, warm, one node']:.0f} ms on one node "
          f"(target < 150 ms); unnamed/warm: small {rows[2][2] / rows[1][2]:.2f}x, "
          f"big {rows[3][2] / rows[1][2]:.2f}x (target <= 2x)")
    print(f"cached registry image {over['unnamed, registry image (cached)']:+.0f} ms, "
          f"{over['registry image (cached), one node']:+.0f} ms on one node (target +150 ms); "
          f"pinned by digest {over['the same, pinned by digest']:+.0f} ms, "
          f"{over['the same, pinned, one node']:+.0f} ms on one node (the difference: the "
          "tag's resolve at submission, less what of it the allocation hid)")
    print_pingpong(mpi, args.mpi_runs)


if __name__ == "__main__":
    main()
