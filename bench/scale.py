#!/usr/bin/env python3
"""What site.yml, the shared store, a step and PMIx cost as the cluster grows.

    python3 bench/scale.py [--nodes 2 8 16 32] [--runs N] [--mpi-runs N]
                           [--image-mb MB] [--realistic DIR [--realistic-gib GIB]]
                           [--no-linear] [--keep] [--quiet]

For each N, a fresh scale test bed of N compute nodes (scripts/scale.sh:
controller and login node berth-scale-ctl with the cluster's registry, a
stand-in upstream, berth-scale-cn1..N, the shared image store on), then:
  site.yml, first run and no-op run   wall s; the no-op must be changed=0 on
                                      every host; with Mitogen (the
                                      scenario's strategy) and, unless
                                      --no-linear, with Ansible's own linear;
                                      and the CPU s per host of Ansible's
                                      processes here (the nodes' module runs
                                      not counted: a real controller's share)
  first srun -N N of a new image      an image pushed for this N (the MPI test
                                      image plus MB of random bytes), as alice
                                      with the store: s until the last node's
                                      task started (each task prints the
                                      kernel's clock: the nodes share the
                                      host's), blob GETs and MB the registry
                                      served (its log; one GET per blob is the
                                      target), the store's requests and how
                                      long they took (its journal: one
                                      imports, the rest wait), the first step
                                      less the longest request (what a node
                                      adds to the import: asking, mounting,
                                      starting), and the CPU s the nodes and
                                      the controller spent on the step (their
                                      cgroups: what two shared cores serve)
  the same, realistic image           with --realistic DIR, at the first N
                                      only (the image is imported once
                                      whatever N): bench/realistic_image.py's
                                      image (--realistic-gib, kept in DIR; a
                                      busybox layer on top), pushed from this
                                      machine, the nodes' memory limits
                                      raised to 2 GiB for it: the same figures
  srun -N N true, bare and named      --runs of each in turns, median ms, and
                                      the container's overhead over bare; the
                                      named container is of a busybox image
                                      (a named container is an unpacked root
                                      per node, in the node's tmpfs: the MPI
                                      image's would take 360 MB of each
                                      node's memory)
  srun -N N --mpi=pmix allreduce      one rank per node, bare (the node's Open
                                      MPI build, prepare.yml) and in the new
                                      image (mounted from the store),
                                      --mpi-runs each, median s
  errors                              slurmctld.log's 'error:' lines and the
                                      store's failed imports after the deploy
  memory                              docker stats of the nodes after deploy
                                      and after the steps
Every row also as a ratio to the first N's value, so that growth shows on a
shared machine. The bed is destroyed at the end unless --keep (also when a
step fails: each site.yml run's whole output stays in
/tmp/berth-scale-logs, the failed tasks are printed).
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
SCALE = ["bash", str(PROJECT / "scripts" / "scale.sh")]
SUITE = os.environ.get("BERTH_NODE_SUITE", "bookworm")
CTL = "berth-scale-ctl"
BUSYBOX = "berth/busybox-scale:1"
LOGS = Path(tempfile.gettempdir()) / "berth-scale-logs"  # each site.yml run's output, the latest
LOGIN = ["docker", "exec", CTL, "runuser", "-u", "alice", "--"]
RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
BLOB_SERVED = re.compile(r'"GET /v2/[^ ]+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" 200 (\d+)')
# The store's journal (-o short-unix): one unit per request, its start and end
STORE_UNIT = re.compile(r"^(\d+\.\d+) \S+ systemd\[1\]: (?:Started )?(berth-store@[^ :]+\.service)"
                        r"(?: - |: Deactivated| ).*$", re.M)
STORE_FAILED = re.compile(r"Failed with result|error|Traceback", re.I)
MEMORY = re.compile(r"^(\S+) ([0-9.]+)(KiB|MiB|GiB)", re.M)
UNITS = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
REALISTIC_MEMORY = "2g"  # a node's limit while the realistic image is imported

quiet = False
measured_commits = {}  # N: the commit scale.sh deployed (a snapshot of HEAD)


def say(text):
    if not quiet:
        print(f"scale: {text}", file=sys.stderr, flush=True)


def command(args, what, env=None):
    result = subprocess.run(args, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"scale: {what} failed (rc {result.returncode}):\n"
                         f"{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout


def on_ctl(script):
    return command(["docker", "exec", CTL, "sh", "-c", script], script)


def on_login(script):
    return command([*LOGIN, "bash", "-c", f"cd /tmp && {script}"], script)


def children_cpu():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def site(label, strategy="mitogen_linear", no_op=False):
    """site.yml on the bed: wall s, and the CPU s of the Ansible side (its
    processes on this machine, not the modules in the nodes); a no-op run
    must change nothing."""
    say(f"site.yml, {label}")
    env = dict(os.environ, BERTH_ANSIBLE_STRATEGY=strategy, ANSIBLE_NOCOLOR="1")
    started, cpu = time.perf_counter(), children_cpu()
    result = subprocess.run([*SCALE, "site"], capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - started, children_cpu() - cpu
    output = result.stdout + result.stderr
    # the whole run, for a failure's cause (the bed and its logs may be gone)
    log = LOGS / f"site-{label.replace(', ', '-').replace(' ', '-')}.log"
    LOGS.mkdir(parents=True, exist_ok=True)
    log.write_text(output)
    recap = RECAP.findall(output)
    busy = [host for host, changed, unreachable, failed in recap
            if unreachable != "0" or failed != "0" or (no_op and changed != "0")]
    if result.returncode != 0 or not recap or busy:
        failed = "\n".join(re.findall(r"^(?:fatal|failed): .*$", output, re.M)) or output[-3000:]
        raise SystemExit(f"scale: site.yml ({label}): rc {result.returncode}, hosts {busy} "
                         f"(all of it in {log}):\n{failed[-4000:]}")
    return seconds, cpu


def memory():
    """MiB in use: the largest and the median compute node, the controller."""
    used = {name: float(value) * UNITS[unit]
            for name, value, unit in MEMORY.findall(command([*SCALE, "memory"], "docker stats"))}
    nodes = [value for name, value in used.items() if "-cn" in name]
    return max(nodes), statistics.median(nodes), used[CTL]


def push_new_image(nodes, megabytes):
    """The MPI test image plus a layer of MB random bytes, new to the cluster
    (a tag and content of its own), in the controller's registry."""
    base = f"berth/mpi-test:{SUITE}"
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        archive = PROJECT / ".cache/images" / SUITE / "mpi-test.tar"
        command(["docker", "load", "-q", "-i", str(archive)], "docker load")
    tag = f"berth/mpi-test-scale:n{nodes}-{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="berth-scale-") as work:
        Path(work, "Dockerfile").write_text(
            f"FROM {base}\nRUN head -c {megabytes}M /dev/urandom > /opt/padding\n")
        command(["docker", "build", "-q", "-t", tag, work], "docker build")
        command(["docker", "save", "-o", f"{work}/image.tar", tag], "docker save")
        # (/var/tmp: the node's /tmp is a tmpfs, which docker cp does not write into)
        command(["docker", "cp", f"{work}/image.tar", f"{CTL}:/var/tmp/scale-image.tar"],
                "docker cp")
    on_ctl("skopeo copy -q --dest-tls-verify=false docker-archive:/var/tmp/scale-image.tar "
           f"docker://localhost:5000/{tag} && rm -f /var/tmp/scale-image.tar")
    command(["docker", "rmi", tag], "docker rmi")
    return f"berth-ctl:5000#{tag}"


def push_busybox():
    """A busybox image (the host's busybox-static) for the named container."""
    with tempfile.TemporaryDirectory(prefix="berth-scale-") as work:
        command(["cp", "/bin/busybox", work], "cp busybox")
        Path(work, "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        Path(work, "group").write_text("root:x:0:\n")
        Path(work, "Dockerfile").write_text(
            "FROM scratch\nCOPY busybox /bin/busybox\nCOPY passwd group /etc/\n"
            'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n')
        command(["docker", "build", "-q", "-t", BUSYBOX, work], "docker build")
        command(["docker", "save", "-o", f"{work}/image.tar", BUSYBOX], "docker save")
        command(["docker", "cp", f"{work}/image.tar", f"{CTL}:/var/tmp/busybox.tar"], "docker cp")
    on_ctl("skopeo copy -q --dest-tls-verify=false docker-archive:/var/tmp/busybox.tar "
           f"docker://localhost:5000/{BUSYBOX} && rm -f /var/tmp/busybox.tar")
    return f"berth-ctl:5000#{BUSYBOX}"


def node_names(nodes):
    return [f"berth-scale-cn{i}" for i in range(1, nodes + 1)]


def store_log(nodes, since, style="cat"):
    """The store's journal on the login and compute nodes since `since`."""
    logs = []
    for name in [CTL, *node_names(nodes)]:
        # (journalctl fails on a node where no such unit ever ran)
        logs.append(command(["docker", "exec", name, "sh", "-c",
                             f"journalctl -u 'berth-store@*' --since=@{since} -o {style} "
                             "--no-pager 2>/dev/null || true"], "journalctl"))
    return "\n".join(logs)


def store_requests(nodes, since):
    """Each store request's seconds, from its unit's first to last line: one
    request imports, the others wait on its lock (the store's side runs
    quiet, so its journal does not say 'waiting'; the time says it)."""
    spans = {}
    for stamp, unit in STORE_UNIT.findall(store_log(nodes, since, "short-unix")):
        first, _ = spans.get(unit, (float(stamp), 0))
        spans[unit] = (first, float(stamp))
    return sorted(last - first for first, last in spans.values())


def cpu_seconds(names):
    """Each container's CPU s so far, from its cgroup (v1's cpuacct or v2's
    cpu.stat, as dockerd's cgroupfs driver lays them out)."""
    ids = command(["docker", "inspect", "-f", "{{.Id}}", *names], "docker inspect").split()
    used = {}
    for name, full in zip(names, ids, strict=True):
        v1 = Path("/sys/fs/cgroup/cpuacct/docker", full, "cpuacct.usage")
        if v1.exists():
            used[name] = int(v1.read_text()) / 1e9
            continue
        for v2 in (Path("/sys/fs/cgroup/docker", full, "cpu.stat"),
                   Path(f"/sys/fs/cgroup/system.slice/docker-{full}.scope/cpu.stat")):
            if v2.exists():
                stat = dict(line.split() for line in v2.read_text().splitlines())
                used[name] = int(stat["usage_usec"]) / 1e6
                break
        else:
            raise SystemExit(f"scale: no cgroup of {name} to read its CPU time from")
    return used


def first_step(nodes, image):
    """The first step's figures by row name: s until the last node's task
    started, blob GETs, distinct blobs, MB served, the store's requests, the
    longest and the median one's s, the step less the longest request, the
    nodes' CPU s (all of them, the median node) and the controller's."""
    mark = int(time.time())
    time.sleep(1.1)  # the logs' resolution is a second
    names = [CTL, *node_names(nodes)]
    cpu_before = cpu_seconds(names)
    # each task says when it started by the kernel's clock (/proc/uptime:
    # CLOCK_BOOTTIME, the same in every container; the shell's builtins
    # alone read it, so it works in an image without date)
    started = time.clock_gettime(time.CLOCK_BOOTTIME)
    out = on_login(f"srun -N{nodes} --ntasks-per-node=1 --container-image={image} "
                   "sh -c 'read up rest </proc/uptime; echo $up'")
    starts = [float(line) for line in out.split()]
    if len(starts) != nodes:
        raise SystemExit(f"scale: first step: {len(starts)} of {nodes} tasks started:\n{out}")
    seconds = max(starts) - started
    cpu = {name: used - cpu_before[name] for name, used in cpu_seconds(names).items()}
    time.sleep(1.1)
    served = BLOB_SERVED.findall(on_ctl(f"journalctl -u docker-registry --since=@{mark} "
                                        "-o cat --no-pager"))
    requests = store_requests(nodes, mark)
    longest = max(requests, default=0)
    nodes_cpu = [cpu[name] for name in node_names(nodes)]
    return {"last task started, s": seconds, "blob GETs": len(served),
            "distinct blobs": len({digest for digest, _ in served}),
            "MB served": sum(int(size) for _, size in served) / 2 ** 20,
            "store requests": len(requests), "store request, longest s": longest,
            "store request, median s": statistics.median(requests or [0]),
            "step less the longest request, s": seconds - longest,
            "CPU s, all nodes": sum(nodes_cpu), "CPU s, median node": statistics.median(nodes_cpu),
            "CPU s, controller": cpu[CTL]}


def first_step_rows(row, label, nodes, image):
    """first_step's figures as rows of `row`: the first under `label`, the
    others indented below it."""
    figures = first_step(nodes, image)
    # (a label's rows are told apart by trailing spaces: one per first step)
    tail = " " * sum(name.startswith("first step") for name in row)
    for number, (name, value) in enumerate(figures.items()):
        row[f"{label}: {name}" if number == 0 else f"  {name}{tail}"] = value
    if figures["blob GETs"] != figures["distinct blobs"]:
        say(f"  a blob served more than once: {figures['blob GETs']} GETs, "
            f"{figures['distinct blobs']} blobs")


def push_realistic(nodes, options):
    """bench/realistic_image.py's image with a busybox layer on top, pushed
    from this machine's layout to the bed's registry (skopeo)."""
    import realistic_image  # (its HTTP client: only with --realistic)
    gib = options.realistic_gib
    top = realistic_image.cached(options.realistic, gib, int(gib * 25_000), 40, quiet=quiet)
    layout = realistic_image.with_shell(top)
    address = command(["docker", "inspect", "-f",
                       '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}', CTL],
                      "docker inspect").split()[0]
    tag = f"berth/realistic-scale:n{nodes}-{int(time.time())}"
    command(["skopeo", "copy", "-q", "--dest-tls-verify=false",
             f"oci:{layout}:{realistic_image.TAG}", f"docker://{address}:5000/{tag}"],
            "skopeo copy (the realistic image)")
    return f"berth-ctl:5000#{tag}"


def timed_turns(commands, runs):
    """Median ms of each command, run in turns so that the machine's
    changing speed hits every one alike."""
    samples = [[] for _ in commands]
    for _ in range(runs):
        for script, times in zip(commands, samples, strict=True):
            started = time.perf_counter()
            on_login(script)
            times.append((time.perf_counter() - started) * 1000)
    return [statistics.median(times) for times in samples]


def allreduce(nodes, program):
    out = on_login(f"srun -N{nodes} --ntasks-per-node=1 --mpi=pmix {program}")
    ranks = len(re.findall(r"^rank \d+ of \d+ on ", out, re.M))
    if ranks != nodes or f"allreduce sum {nodes * (nodes + 1) // 2}" not in out:
        raise SystemExit(f"scale: allreduce over {nodes} nodes ({program}):\n{out}")


def errors(nodes, since):
    """slurmctld's error lines and the store's failures since `since`."""
    log = on_ctl("cat /var/log/slurm/slurmctld.log")
    slurmctld = [line for line in log.splitlines() if "error:" in line
                 and _log_time(line) >= since]
    store = [line for line in store_log(nodes, int(since)).splitlines()
             if STORE_FAILED.search(line)]
    for line in (slurmctld + store)[:10]:
        say(f"  error: {line}")
    return len(slurmctld), len(store)


def _log_time(line):
    """The epoch seconds of a slurmctld.log line ([2026-11-28T08:28:12.345])."""
    stamp = re.match(r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", line)
    if not stamp:
        return 0
    return time.mktime(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S"))


def measure(nodes, options):
    """Every row's value for one N, on a fresh bed."""
    row = {}
    began = time.time()
    say(f"N={nodes}: a fresh bed (scale.sh destroy, create {nodes}, prepare)")
    command([*SCALE, "destroy"], "scale.sh destroy")
    started = time.perf_counter()
    command([*SCALE, "create", str(nodes)], "scale.sh create")
    command([*SCALE, "prepare"], "scale.sh prepare")
    row["bed: create + prepare.yml, s"] = time.perf_counter() - started
    measured_commits[nodes] = (PROJECT / ".cache/scale/commit").read_text().strip()
    row["site.yml first run, s"], _ = site("first run")
    row["site.yml no-op (Mitogen), s"], cpu = site("no-op, Mitogen", no_op=True)
    row["  per host, s"] = row["site.yml no-op (Mitogen), s"] / (nodes + 1)
    # what a controller of its own would still pay per host
    row["  Ansible's own CPU per host, s"] = cpu / (nodes + 1)
    if not options.no_linear:
        row["site.yml no-op (linear), s"], cpu = site("no-op, linear", "linear", no_op=True)
        row["  Ansible's own CPU per host, s "] = cpu / (nodes + 1)
    row["memory after deploy: node max, MiB"], row["  node median, MiB"], \
        row["  controller, MiB"] = memory()
    deployed = time.time()

    say(f"N={nodes}: a new image (+{options.image_mb} MB) into the registry")
    image = push_new_image(nodes, options.image_mb)
    say(f"N={nodes}: first srun -N{nodes} of {image} with the store")
    first_step_rows(row, "first step, new image", nodes, image)
    if options.realistic and nodes == options.nodes[0]:
        # the node that imports it for the cluster holds mksquashfs's cache
        # besides its own services: more than the bed's 512 MiB
        say(f"N={nodes}: the nodes' memory limits to {REALISTIC_MEMORY} "
            f"(docker update); the realistic image ({options.realistic_gib:g} GiB) "
            "into the registry")
        command(["docker", "update", "--memory", REALISTIC_MEMORY, "--memory-swap",
                 REALISTIC_MEMORY, *node_names(nodes)], "docker update")
        realistic = push_realistic(nodes, options)
        say(f"N={nodes}: first srun -N{nodes} of {realistic} with the store")
        first_step_rows(row, f"first step, realistic {options.realistic_gib:g} GiB image",
                        nodes, realistic)

    say(f"N={nodes}: warm steps, {options.runs} each, bare and named container")
    on_login(f"srun -N{nodes} --container-name=scale --container-image={push_busybox()} true")
    bare, named = timed_turns(
        [f"srun -N{nodes} true", f"srun -N{nodes} --container-name=scale true"], options.runs)
    row["srun true bare, ms"], row["srun true named container, ms"] = bare, named
    row["  container overhead, ms"] = named - bare

    say(f"N={nodes}: allreduce, one rank per node, {options.mpi_runs} each, bare and container")
    programs = ["/opt/berth-test/mpi_allreduce",
                f"--container-image={image} /opt/mpi-test/allreduce-openmpi"]
    for program in programs:
        allreduce(nodes, program)  # checks ranks and sum once; the timed runs below
    bare_mpi, container_mpi = timed_turns(
        [f"srun -N{nodes} --ntasks-per-node=1 --mpi=pmix {program} >/dev/null"
         for program in programs], options.mpi_runs)
    row["allreduce pmix bare, s"] = bare_mpi / 1000
    row["allreduce pmix container (store), s"] = container_mpi / 1000

    row["memory after steps: node max, MiB"], row["  node median, MiB "], \
        row["  controller, MiB "] = memory()
    row["slurmctld errors"], row["store errors"] = errors(nodes, deployed)
    row["bench wall time for this N, s"] = time.time() - began
    say(f"N={nodes}: done in {row['bench wall time for this N, s']:.0f} s")
    return row


def print_table(results):
    counts = list(results)
    first = results[counts[0]]
    header = f"{'':46}" + "".join(f"{'N=' + str(n):>18}" for n in counts)
    print(header)
    for label in first:
        cells = []
        for n in counts:
            value, base = results[n].get(label), first[label]
            if value is None:  # (a row of the first N only)
                cells.append(f"{'':>18}")
                continue
            text = f"{value:.0f}" if isinstance(value, int) or value >= 100 else f"{value:.2f}"
            if n != counts[0] and base:
                text += f" ({value / base:.2f}x)"
            cells.append(f"{text:>18}")
        print(f"{label:46}" + "".join(cells))
    commits = ", ".join(f"N={n} {commit}" for n, commit in measured_commits.items())
    print(f"(ratios to N={counts[0]}; commits {commits}; machine: {os.cpu_count()} cores, "
          f"load average at the end {os.getloadavg()[0]:.1f})")


def main():
    global quiet
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8, 16, 32])
    parser.add_argument("--runs", type=int, default=5, help="warm steps of each kind")
    parser.add_argument("--mpi-runs", type=int, default=3, help="allreduce runs of each kind")
    parser.add_argument("--image-mb", type=int, default=64, help="the new image's random layer")
    parser.add_argument("--realistic", metavar="DIR",
                        help="also the first step of bench/realistic_image.py's image, kept in DIR")
    parser.add_argument("--realistic-gib", type=float, default=10,
                        help="its size unpacked (25,000 files a GiB, 40 layers)")
    parser.add_argument("--no-linear", action="store_true",
                        help="leave out the no-op run with Ansible's own strategy")
    parser.add_argument("--keep", action="store_true", help="leave the last bed up")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    options = parser.parse_args()
    quiet = options.quiet
    if any(not 2 <= n <= 32 for n in options.nodes):
        parser.error("--nodes: each N is 2..32")
    results = {}
    try:
        for nodes in options.nodes:
            results[nodes] = measure(nodes, options)
    finally:
        if not options.keep:
            say("removing the bed (scale.sh destroy)")
            subprocess.run([*SCALE, "destroy"], check=False)
        if results:
            print_table(results)


if __name__ == "__main__":
    main()
