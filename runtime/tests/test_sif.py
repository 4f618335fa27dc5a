"""SIF images (Apptainer's, Singularity's) started, created and described in
place, in real namespaces as an unprivileged user; every SIF file here is
made by the format's reference tool, siftool (the fixtures are
test_container's). The signature object's bytes are made up (siftool
cannot sign): Berth reports signatures and never verifies them."""

import contextlib
import os
import random
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from container_fixture import (
    build_root,
    make_readable,
    pids_of,
    squash,
    start_detached,
    world_readable_dir,
)

from berth.errors import BerthError
from berth.image import imagefile, sif
from berth.image.imageconfig import goarch

FINGERPRINT = "433FE984155206BD962725E20E8713472A879943"
ENV_SCRIPT = """\
export FROM_SIF=set-by-image
export PATH="/opt/sif/bin:$PATH"
export WHO_WINS=image
echo "env script of the image ran" >&2
"""
# A script that signals its process group (its $PPID is 0 in the reader's pid
# namespace: the same), then every process it may signal.
KILLING_SCRIPT = """\
kill -9 0
kill -9 $PPID
sleep 9994 &
kill -9 -1
export FROM_SIF=after-killing
"""
RUNSCRIPT = '#!/bin/sh\necho "runscript got: $*"\n'
OTHER_ARCH = "arm64" if goarch() != "arm64" else "amd64"
ARCH_CODES = {name: int(code) for code, name in sif.ARCHES.items()}


def siftool(*args):
    subprocess.run(["siftool", *map(str, args)], check=True, capture_output=True)


def make_sif(path, squashfs, part_type=2, filesystem=1, arch=None, extra=()):
    """A SIF file by siftool: a definition file, then `squashfs` as a partition
    (primary system, squashfs, this node's architecture unless told), then
    each (datatype, file, options...) of `extra`."""
    siftool("new", path)
    siftool("add", path, __file__, "--datatype", 1)
    siftool("add", path, squashfs, "--datatype", 4, "--parttype", part_type,
            "--partfs", filesystem, "--partarch", ARCH_CODES[arch or goarch()])
    for datatype, data, *options in extra:
        siftool("add", path, data, "--datatype", datatype, *options)
    path.chmod(0o644)


def apptainer_root(root, env_script=ENV_SCRIPT, runscript=RUNSCRIPT):
    """A busybox root laid out as Apptainer builds one: no OCI config, an
    environment script in /.singularity.d/env, a runscript."""
    build_root(root, rc=False)
    (root / ".singularity.d/env").mkdir(parents=True)
    (root / ".singularity.d/env/90-environment.sh").write_text(env_script)
    (root / ".singularity.d/runscript").write_text(runscript)
    (root / ".singularity.d/runscript").chmod(0o755)
    (root / "opt/sif/bin").mkdir(parents=True)
    (root / "opt/sif/bin/sif-tool").write_text("#!/bin/sh\necho sif-tool on PATH\n")
    (root / "opt/sif/bin/sif-tool").chmod(0o755)


@pytest.fixture(scope="session")
def sifs():
    top = world_readable_dir("bctr-sif-")
    apptainer_root(top / "root")
    squash(top / "root", top / "app.sqsh")
    signature = top / "signature.bin"
    signature.write_bytes(b"-----BEGIN PGP SIGNED MESSAGE-----\nmade up\n")
    make_sif(top / "app.sif", top / "app.sqsh")
    make_sif(top / "signed.sif", top / "app.sqsh", extra=[
        (5, signature, "--signentity", FINGERPRINT, "--signhash", 2, "--link", 2)])
    make_sif(top / "other-arch.sif", top / "app.sqsh", arch=OTHER_ARCH)
    make_sif(top / "encrypted.sif", top / "app.sqsh", filesystem=5)
    make_sif(top / "ext3.sif", top / "app.sqsh", filesystem=2)
    make_sif(top / "overlay-only.sif", top / "app.sqsh", part_type=4)
    whole = (top / "app.sif").read_bytes()
    (top / "truncated.sif").write_bytes(whole[:len(whole) - 4096])
    outside = bytearray(whole)  # the partition's size (2nd descriptor's, at byte 25) past the end
    table = struct.unpack_from("<q", whole, 96)[0]
    struct.pack_into("<q", outside, table + sif._DESCRIPTOR.size + 25, 1 << 40)
    (top / "outside.sif").write_bytes(bytes(outside))
    apptainer_root(top / "failing", env_script="exit 3\n")
    squash(top / "failing", top / "failing.sqsh")
    make_sif(top / "failing.sif", top / "failing.sqsh")
    apptainer_root(top / "hanging", env_script="while :; do :; done\n")
    squash(top / "hanging", top / "hanging.sqsh")
    make_sif(top / "hanging.sif", top / "hanging.sqsh")
    apptainer_root(top / "sleeping", env_script="sleep 301\n")
    squash(top / "sleeping", top / "sleeping.sqsh")
    make_sif(top / "sleeping.sif", top / "sleeping.sqsh")
    apptainer_root(top / "killing", env_script=KILLING_SCRIPT)
    squash(top / "killing", top / "killing.sqsh")
    make_sif(top / "killing.sif", top / "killing.sqsh")
    make_readable(top)
    yield top
    shutil.rmtree(top)


def test_a_sif_image_starts_in_place_with_its_environment(berth, sifs):
    out = berth.ok("start", sifs / "app.sif", "sh", "-c", 'echo "$FROM_SIF $PATH"; sif-tool')
    assert out.splitlines() == [
        "set-by-image /opt/sif/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "sif-tool on PATH"]
    # the root is the file's partition, served where it lies: nothing copied or unpacked
    assert not (berth.base / "data").exists() or os.listdir(berth.base / "data") == []
    assert berth.leftovers() == []
    # the command's -e wins over the image's scripts, as over a Docker image's env
    assert berth.ok("start", "-e", "WHO_WINS=caller", sifs / "app.sif",
                    "sh", "-c", "echo $WHO_WINS") == "caller\n"


def test_the_runscript_is_the_entrypoint_as_apptainer_run_runs_it(berth, sifs):
    assert berth.ok("start", "--entrypoint", sifs / "app.sif", "a", "b") == "runscript got: a b\n"
    assert berth.ok("start", sifs / "app.sif") == "runscript got: \n"  # no command: run


def test_a_detached_start_gives_its_tasks_the_image_environment(berth, sifs):
    """The keeper's /proc/PID/environ is what the SPANK plugin's tasks get."""
    process = subprocess.Popen(berth.command("start", "--detach", sifs / "app.sif"),
                               env=berth.env, cwd=berth.base, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(process.stdout.readline())
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = dict(entry.split(b"=", 1) for entry in f.read().split(b"\0") if entry)
        assert environ[b"FROM_SIF"] == b"set-by-image"
        assert environ[b"PATH"].startswith(b"/opt/sif/bin:")
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert berth.leftovers() == []


def test_create_and_a_writable_start_unpack_the_partition(berth, sifs):
    berth.ok("create", sifs / "app.sif")  # named after the file, as for .sqsh
    assert (berth.base / "data/app/.singularity.d/runscript").is_file()
    assert berth.ok("start", "app", "sh", "-c", "echo $FROM_SIF") == "set-by-image\n"
    assert berth.ok("start", "--rw", sifs / "app.sif", "sh", "-c",
                    "echo changed > /etc/new && cat /etc/new") == "changed\n"
    berth.fails("create", "-n", "x.sif", sifs / "app.sif", needle="invalid container name 'x.sif'")


def test_import_describes_the_file_and_never_claims_a_verified_signature(berth, sifs):
    out = berth.ok("import", sifs / "signed.sif").splitlines()
    assert out[0] == f"{sifs}/signed.sif: SIF image, runs in place (berth start, berth create, " \
                     "srun --container-image take it as it is)"
    assert f"  system partition: squashfs, {goarch()}," in out[1]
    assert out[-1] == (f"  signed (SHA-384) by key {FINGERPRINT}: NOT verified "
                       "(Berth does not verify SIF signatures)")
    assert berth.ok("import", sifs / "app.sif").splitlines()[-1] == "  not signed"
    assert berth.ok("--quiet", "import", sifs / "app.sif") == ""  # srun's check at submission
    berth.fails("--quiet", "import", sifs / "encrypted.sif", needle="is encrypted")
    shutil.copy(sifs / "app.sqsh", berth.base / "named-so.sif")  # a squashfs, whatever its name
    berth.chown(berth.base / "named-so.sif")
    berth.fails("import", "named-so.sif", needle="named-so.sif: a squashfs image, not a SIF file")
    berth.fails("import", "-o", "x.sqsh", sifs / "app.sif", needle="-o/--output: not with a SIF")
    assert not (berth.base / "x.sqsh").exists()


@pytest.mark.parametrize("name, reason", [
    ("other-arch.sif", f"built for {OTHER_ARCH}; this node is {goarch()}"),
    ("encrypted.sif", "its system partition is encrypted: Berth does not decrypt SIF images"),
    ("ext3.sif", "its system partition is ext3: Berth runs squashfs partitions only"),
    ("overlay-only.sif", "no primary system partition to run (it holds: definition file "),
    ("truncated.sif", "lie outside the"),
    ("outside.sif", "lie outside the"),
])
def test_bad_sif_files_are_refused_in_one_line_by_every_verb(berth, sifs, name, reason):
    for verb in (["start"], ["create"], ["import"]):
        line = berth.fails(*verb, sifs / name, *(["true"] if verb == ["start"] else []),
                           needle=reason)
        assert f"{sifs}/{name}: " in line
    assert not (berth.base / "data").exists() or os.listdir(berth.base / "data") == []


def test_env_scripts_that_fail_or_hang_fail_the_start_in_one_line(berth, sifs):
    berth.fails("start", sifs / "failing.sif", "true",
                needle="/.singularity.d/env scripts failed (/bin/sh exit status 3)")
    began = time.monotonic()
    berth.fails("start", sifs / "hanging.sif", "true", env={"BERTH_ENTRYPOINT_TIMEOUT": "2"},
                needle="/.singularity.d/env scripts have not finished after 2 s")
    assert time.monotonic() - began < 30
    # a script waiting on a child: that child goes too (it held berth's stderr)
    berth.fails("start", sifs / "sleeping.sif", "true", env={"BERTH_ENTRYPOINT_TIMEOUT": "1"},
                needle="/.singularity.d/env scripts have not finished after 1 s")
    assert pids_of(berth.user.pw_uid, "sleep 301") == []


def test_what_env_scripts_kill_is_in_their_reading_and_the_start_goes_on(berth, sifs):
    """kill -9 0, kill -9 $PPID and kill -9 -1 reach only the reading's own
    processes (its shell, pid 1 there, ignores them): berth and the command
    run on with what the scripts export. berth runs in a session of the
    test's own: a kill 0 that gets out of the reading reaches nothing else."""
    result = berth("start", sifs / "killing.sif", "sh", "-c", "echo $FROM_SIF",
                   start_new_session=True)
    assert (result.returncode, result.stdout) == (0, "after-killing\n"), result.stderr
    assert pids_of(berth.user.pw_uid, "sleep 9994") == []
    assert berth.leftovers() == []


# Env scripts that leave processes behind: one detached by setsid through a
# double fork, a crowd in the background, a loop that keeps forking.
DETACHING_SCRIPT = """\
( setsid sleep 9991 & )
i=0
while [ "$i" -lt 300 ]; do sleep 9992 & i=$((i + 1)); done
( setsid sh -c 'while :; do sleep 9993 & sleep 0.2; done # fork loop' & )
export FROM_SIF=after-detaching
"""
LEFT = ("fork loop", "sleep 999")


@pytest.fixture(scope="module")
def detaching_sif():
    top = world_readable_dir("bctr-sifd-")
    apptainer_root(top / "root", env_script=DETACHING_SCRIPT)
    squash(top / "root", top / "detaching.sqsh")
    make_sif(top / "detaching.sif", top / "detaching.sqsh")
    make_readable(top)
    yield top / "detaching.sif"
    shutil.rmtree(top)


def left_behind(uid):
    return [pid for needle in LEFT for pid in pids_of(uid, needle)]


def kill_left_behind(uid):
    for needle in LEFT:  # the loop first: it makes more
        for pid in pids_of(uid, needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_what_env_scripts_start_ends_with_their_reading(berth, detaching_sif):
    """Nothing the scripts start outlives the reading of what they export,
    nor holds the caller's output: `berth start X.sif true | cat` ends."""
    uid = berth.user.pw_uid
    try:
        process = subprocess.Popen(berth.command("start", detaching_sif, "sh", "-c",
                                                 "echo $FROM_SIF"),
                                   env=berth.env, cwd=berth.base, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        out, err = process.communicate(timeout=60)  # both pipes at their end
        assert process.returncode == 0, err
        assert out == "after-detaching\n"
        assert left_behind(uid) == []
        # a detached start (a Slurm step's): gone before its pid is printed
        process, pid = start_detached(berth, detaching_sif)
        try:
            assert left_behind(uid) == []
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"FROM_SIF=after-detaching" in environ
        finally:
            process.stdin.close()
            assert process.wait(timeout=30) == 0
        assert berth.leftovers() == []
    finally:
        kill_left_behind(uid)


def test_a_sif_file_is_a_data_image_for_a_sqsh_mount(berth, sifs, images):
    """CSCS's `sqsh` mount flag takes a SIF file's partition as it takes a squashfs."""
    out = berth.ok("start", "-m", f"{sifs}/app.sif:/data:sqsh", images / "app.sqsh",
                   "cat", "/data/.singularity.d/runscript")
    assert out == RUNSCRIPT
    berth.fails("start", "-m", f"{sifs}/encrypted.sif:/data:sqsh", images / "app.sqsh", "true",
                needle=f"mount source {sifs}/encrypted.sif: its system partition is encrypted")


def test_a_fifo_or_directory_named_like_a_sif_is_refused_without_blocking(berth):
    os.mkfifo(berth.base / "pipe.sif")
    (berth.base / "dir.sif").mkdir()
    berth.chown(berth.base)
    berth.fails("start", "pipe.sif", "true", needle="pipe.sif: is not a regular file", timeout=20)
    berth.fails("import", "pipe.sif", needle="pipe.sif: is not a regular file", timeout=20)
    berth.fails("create", "dir.sif", needle="dir.sif: is a directory")


def test_a_sif_that_is_a_link_to_proc_self_mem_is_refused_in_one_line(berth):
    """A regular file that cannot be read: os.pread raised EIO uncaught."""
    os.symlink("/proc/self/mem", berth.base / "mem.sif")
    berth.chown(berth.base)
    berth.fails("start", "mem.sif", "true", needle="mem.sif: cannot read: Input/output error")
    berth.fails("import", "mem.sif", needle="mem.sif: cannot read: Input/output error")


def _mutations(data, count, seed=31):
    """`count` hostile variants of a SIF file: bytes of its header and
    descriptor table flipped, int64 fields set to extremes, truncations."""
    rng = random.Random(seed)
    table_end = 4096 + 3 * sif._DESCRIPTOR.size
    extremes = [0, -1, 1 << 62, -(1 << 63), (1 << 63) - 1, len(data), len(data) + 1, 4096, 32768]
    for n in range(count):
        mutated = bytearray(data)
        kind = n % 3
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                spot = rng.choice([rng.randrange(0, 128), rng.randrange(4096, table_end)])
                mutated[spot] = rng.randrange(256)
        elif kind == 1:
            spot = rng.choice([64 + 8 * rng.randrange(8),  # the header's int64s
                               4096 + rng.randrange(3) * sif._DESCRIPTOR.size + 17
                               + 8 * rng.randrange(3)])  # a descriptor's offset, sizes
            struct.pack_into("<q", mutated, spot, rng.choice(extremes))
        else:
            mutated = mutated[:rng.randrange(0, len(data))]
        yield bytes(mutated)


def test_fuzzed_sif_headers_are_read_or_refused_in_one_line_never_beyond_the_file(
        sifs, tmp_path, monkeypatch):
    reads = []
    real_pread = os.pread

    def watched_pread(fd, length, offset):
        reads.append((offset, length, os.fstat(fd).st_size))
        return real_pread(fd, length, offset)
    monkeypatch.setattr(sif.os, "pread", watched_pread)
    data = (sifs / "signed.sif").read_bytes()
    path = tmp_path / "fuzzed.sif"
    outcomes = {"read": 0, "refused": 0}
    for mutated in _mutations(data, 600):
        path.write_bytes(mutated)
        reads.clear()
        try:
            image = imagefile.locate(str(path))
        except BerthError as e:
            message = str(e)
            assert message.startswith(f"{path}: ") and "\n" not in message, message
            outcomes["refused"] += 1
        else:
            assert 0 < image.offset and image.offset + image.sif.size <= len(mutated)
            outcomes["read"] += 1
        # every read starts inside the file and none asks for more than a header and a
        # descriptor table of at most MAX_DESCRIPTORS entries
        for offset, length, size in reads:
            assert 0 <= offset <= size and length <= sif.MAX_DESCRIPTORS * sif._DESCRIPTOR.size
    assert outcomes["read"] > 50 and outcomes["refused"] > 250, outcomes
