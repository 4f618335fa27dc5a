#!/usr/bin/env python3
"""Where the store's node-local copies (BERTH_IMAGE_STORE_LOCAL) pay: one
squashfs image read from a store on local disk, from a store on a network
filesystem, and from a node-local copy of it, in the same run.

    /opt/berth-dev/venv/bin/python bench/store_local.py [--runs N] [--delay-ms MS ...]
        [DIR ...]

Run as root (squashfuse and sshfs mounts, an sshd). Makes one squashfs of
each DIR (default /usr/include and /usr/lib/python3/dist-packages: many
small files, as a Python or CUDA image has), puts it in a "store"
directory on local disk, and serves that directory over sshfs (SFTP to an
sshd this script starts on a free port of 127.0.0.1, stopped at the end),
once as it is and once per --delay-ms through a relay that delays every
chunk each way by half of it (a simulated network round trip; default 1
ms, a LAN NFS server under load; 0 leaves it out). For each place, the
median of N runs (default 5) of:

  start     squashfuse mount, read the image's root directory and one small
            file, unmount (what a step's start reads before the program runs)
  read all  squashfuse mount, read every file of the image, unmount (a step
            that touches its whole image: imports of a Python stack, say)

and, for each network place, the node-local copy's cost: one copy of the
image to local disk with fsync (what serve does once per node and image)
and both figures read from that copy. The baseline is the store on local
disk. Local disk and the copy are read through the page cache (warm after
the first run), as a node's second step reads them; sshfs data is read
again at each open (FUSE drops its cache), as every step on a network
filesystem without a client cache would.
"""

import argparse
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_DIRS = ["/usr/include", "/usr/lib/python3/dist-packages"]


def relay(port, delay):
    """--relay: ssh's ProxyCommand, stdin/stdout to 127.0.0.1:port, each
    chunk held `delay` seconds each way (latency, not a throughput cap)."""
    sock = socket.create_connection(("127.0.0.1", port))

    def pump(read, write):
        held = queue.Queue()

        def sender():
            while True:
                due, data = held.get()
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                if not data:
                    os._exit(0)
                write(data)

        threading.Thread(target=sender, daemon=True).start()
        while True:
            data = read()
            held.put((time.monotonic() + delay, data))
            if not data:
                return

    def to_stdout(data):
        os.write(1, data)

    threading.Thread(target=pump, args=(lambda: sock.recv(1 << 16), to_stdout),
                     daemon=True).start()
    pump(lambda: os.read(0, 1 << 16), sock.sendall)
    time.sleep(delay + 1)
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """An sshd of this run's: its own host key, config and port, root by key."""

    def __init__(self, top):
        self.top, self.port = top, free_port()
        self.key = top / "id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(top / "host")],
                       check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)],
                       check=True)
        (top / "authorized").write_text((top / "id.pub").read_text())
        (top / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {top / 'host'}\n"
            f"AuthorizedKeysFile {top / 'authorized'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nUsePAM no\nStrictModes no\n"
            f"PidFile {top / 'sshd.pid'}\nSubsystem sftp internal-sftp\n")
        os.makedirs("/run/sshd", exist_ok=True)
        self.process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f",
                                         str(top / "sshd_config")],
                                        stderr=open(top / "sshd.log", "wb"))
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    log = (top / "sshd.log").read_text()
                    raise SystemExit(f"sshd did not start: {log}") from None
                time.sleep(0.1)

    def mount(self, remote, mountpoint, delay):
        options = [f"IdentityFile={self.key}", "StrictHostKeyChecking=no",
                   "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]
        if delay:
            options.append(f"ProxyCommand={sys.executable} {Path(__file__).resolve()} "
                           f"--relay {self.port} {delay}")
        mountpoint.mkdir()
        subprocess.run(["sshfs", "-p", str(self.port), *sum((["-o", o] for o in options), []),
                        f"root@127.0.0.1:{remote}", str(mountpoint)], check=True)

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


def unmount(mountpoint):
    subprocess.run(["fusermount", "-u", str(mountpoint)], check=True)


def squash(dirs, image, scratch):
    source = scratch / "root"
    source.mkdir()
    for directory in dirs:
        target = source / directory.strip("/")
        shutil.copytree(directory, target, symlinks=True)
    subprocess.run(["mksquashfs", str(source), str(image), "-noappend", "-no-progress",
                    "-quiet", "-comp", "zstd", "-Xcompression-level", "3"], check=True)
    shutil.rmtree(source)


def start(image, mnt):
    subprocess.run(["squashfuse", str(image), str(mnt)], check=True)
    try:
        os.listdir(mnt)
        with open(next(p for p in Path(mnt).rglob("*") if p.is_file()), "rb") as f:
            f.read()
    finally:
        unmount(mnt)


def read_all(image, mnt):
    subprocess.run(["squashfuse", str(image), str(mnt)], check=True)
    try:
        for root, _, files in os.walk(mnt):
            for name in files:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    with open(path, "rb") as f:
                        while f.read(1 << 20):
                            pass
    finally:
        unmount(mnt)


def copy(image, target):
    with open(image, "rb") as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out, 8 << 20)
        out.flush()
        os.fsync(out.fileno())


def median(runs, work, *args):
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        work(*args)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def seconds(value):
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def print_table(rows):
    header = ("image read from", "start", "read all", "vs local disk", "copy once",
              "copy + read all")
    lines = [header] + rows
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                        for i, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip())


def install_missing_tools():
    """sshfs and sshd, which scripts/bootstrap-host.sh does not install: from
    Debian's mirror, with every service start refused while dpkg runs (the
    package would start the host's own sshd on port 22; this script runs its
    own)."""
    if shutil.which("sshfs") and os.path.exists("/usr/sbin/sshd"):
        return
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")  # invoke-rc.d: "action forbidden"
        policy.chmod(0o755)
    try:
        for command in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                         "sshfs", "openssh-server"]):
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    finally:
        if made:
            policy.unlink()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--relay":
        relay(int(sys.argv[2]), float(sys.argv[3]) / 2000)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, action="append")
    parser.add_argument("dirs", nargs="*", default=DEFAULT_DIRS)
    args = parser.parse_args()
    delays = [d for d in (args.delay_ms if args.delay_ms is not None else [1.0]) if d > 0]
    if os.geteuid() != 0:
        raise SystemExit("run as root: squashfuse, sshfs and an sshd")
    install_missing_tools()
    top = Path(tempfile.mkdtemp(prefix="berth-bench-store-", dir="/var/tmp"))
    sshd, mounts = None, []
    try:
        store = top / "store"
        store.mkdir()
        image = store / "image.sqsh"
        squash(args.dirs, image, top)
        files = sum(len(f) for d in args.dirs for _, _, f in os.walk(d))
        mnt = top / "mnt"
        mnt.mkdir()
        sshd = Sshd(top)
        places = [("sshfs, loopback", 0)] + [(f"sshfs, +{d:g} ms round trip", d) for d in delays]
        baseline = (median(args.runs, start, image, mnt), median(args.runs, read_all, image, mnt))
        rows = [("store on local disk", seconds(baseline[0]), seconds(baseline[1]), "1.00x", "",
                 "")]
        for i, (label, delay) in enumerate(places):
            remote = top / f"sshfs{i}"
            sshd.mount(store, remote, delay)
            mounts.append(remote)
            shared = remote / "image.sqsh"
            took = (median(args.runs, start, shared, mnt), median(args.runs, read_all, shared, mnt))
            rows.append((f"store on {label}", seconds(took[0]), seconds(took[1]),
                         f"{took[1] / baseline[1]:.2f}x", "", ""))
            local = top / f"copy{i}.sqsh"
            began = time.perf_counter()
            copy(shared, local)
            once = time.perf_counter() - began
            took = (median(args.runs, start, local, mnt), median(args.runs, read_all, local, mnt))
            rows.append(("  node-local copy of it", seconds(took[0]), seconds(took[1]),
                         f"{took[1] / baseline[1]:.2f}x", seconds(once),
                         seconds(once + took[1])))
        size = image.stat().st_size
        print(f"image: {size / 2**20:.0f} MiB squashfs of {', '.join(args.dirs)}"
              f" ({files} files); median of {args.runs} runs")
        print_table(rows)
    finally:
        for remote in mounts:
            subprocess.run(["fusermount", "-u", str(remote)], check=False)
        if sshd is not None:
            sshd.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
