"""spank_berth.so: builds warning-free, its option parser passes its C tests
without leaks, it carries the symbols Slurm looks for, and a real srun/sbatch
refuses bad --container-* flags before anything is submitted."""

import ctypes
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPANK = Path(__file__).resolve().parent.parent / "spank"
SLURM_VERSION_H = Path("/usr/include/slurm/slurm_version.h")

pytestmark = pytest.mark.skipif(
    not SLURM_VERSION_H.exists(), reason="needs Slurm headers (libslurm-dev)"
)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("spank")
    subprocess.run(
        ["make", "-s", "-C", str(SPANK), f"O={out}", "all", f"{out}/test_options"],
        check=True, capture_output=True, text=True,
    )
    return out


def _slurm_version_number():
    for line in SLURM_VERSION_H.read_text().splitlines():
        if line.startswith("#define SLURM_VERSION_NUMBER"):
            return int(line.split()[2], 16)
    raise AssertionError("no SLURM_VERSION_NUMBER in slurm_version.h")


def test_option_parser_c_tests_pass(build):
    result = subprocess.run([build / "test_options"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert "all option tests passed" in result.stdout


def test_option_parser_has_no_leaks_or_memory_errors(build):
    assert shutil.which("valgrind"), "valgrind is needed for this test (apt install valgrind)"
    result = subprocess.run(
        ["valgrind", "--quiet", "--leak-check=full", "--errors-for-leak-kinds=all",
         "--error-exitcode=99", build / "test_options"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr


def test_plugin_exports_spank_entry_points(build):
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", build / "spank_berth.so"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    for name in ("slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_user_init",
                 "slurm_spank_task_init", "slurm_spank_exit",
                 "plugin_name", "plugin_type", "plugin_version", "spank_plugin_version"):
        assert name in symbols, name


def test_plugin_keeps_its_modules_functions_to_itself(build):
    """The functions the plugin's modules share (their headers, all but
    those of the option parser, PARSER_SRC in the Makefile) are not
    exported: an exported one would be bound to the loading program's symbol
    of the same name, and slurmstepd exports a setup_container of its own."""
    exported = set(subprocess.run(
        ["nm", "-D", "--defined-only", build / "spank_berth.so"],
        check=True, capture_output=True, text=True,
    ).stdout.split())
    makefile = (SPANK / "Makefile").read_text()
    parser = {Path(c).with_suffix(".h").name
              for c in re.search(r"^PARSER_SRC = (.*)$", makefile, re.M).group(1).split()}
    assert "plugstack.h" in parser
    shared = set()
    for header in SPANK.glob("*.h"):
        if header.name not in parser:
            shared |= set(re.findall(r"^[a-z][\w ]*?[ *]+(\w+)\(", header.read_text(), re.M))
    assert "setup_container" in shared and "berth_create" in shared
    assert not shared & exported


def test_plugin_identifies_itself_to_this_slurm(build):
    # RTLD_LAZY: the slurm_* functions it calls come from srun/slurmstepd.
    lib = ctypes.CDLL(str(build / "spank_berth.so"), mode=os.RTLD_LAZY)
    # pyxis's name: Slurm names the job's option variables after it
    # (SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image), and scripts use them.
    assert (ctypes.c_char * 32).in_dll(lib, "plugin_name").value == b"pyxis"
    assert (ctypes.c_char * 32).in_dll(lib, "plugin_type").value == b"spank"
    assert ctypes.c_uint.in_dll(lib, "plugin_version").value == _slurm_version_number()


# ---- through a real srun/sbatch: option callbacks run before any submission


# The runtime as the submission side uses it: `import --resolve URI` pins a
# registry image's tag (the URI with a digest; "fail" in it: an unreachable
# registry). Every call is a line in the file named by $1 of the stub.
RESOLVE_STUB = """#!/bin/sh
echo "$*" >>{calls}
case "$1 $2" in
"import --resolve")
    case $3 in *fail*) echo "berth: error: cannot reach the registry" >&2; exit 1 ;; esac
    case $3 in *slow*) echo $$ >{calls}.pid; exec sleep 60 ;; esac
    echo "$3@sha256:{zeros}" ;;
*) echo "stub berth: $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture()
def slurm_conf(build, tmp_path):
    """A slurm.conf whose controller is never reached: bad flags stop first.
    The plugin's berth= is a stub that resolves tags (RESOLVE_STUB, calls in
    tmp_path/calls) unless the arguments name another."""
    stub = tmp_path / "resolve-berth"
    stub.write_text(RESOLVE_STUB.format(calls=tmp_path / "calls", zeros="0" * 64))
    stub.chmod(0o755)

    def write(*plugin_args, conf_lines=""):
        plugstack = tmp_path / "plugstack.conf"
        plugstack.write_text(" ".join(["required", str(build / "spank_berth.so"),
                                       f"berth={stub}", *plugin_args]) + "\n")
        conf = tmp_path / "slurm.conf"
        conf.write_text(
            "ClusterName=bspk\nSlurmctldHost=localhost\nMessageTimeout=1\n"
            f"PlugStackConfig={plugstack}\n"
            "NodeName=localhost CPUs=1 State=UNKNOWN\n"
            "PartitionName=p Nodes=localhost Default=YES\n" + conf_lines)
        return {**os.environ, "SLURM_CONF": str(conf)}
    return write


needs_srun = pytest.mark.skipif(not shutil.which("srun"), reason="needs slurm-client")


def _run(env, *argv):
    return subprocess.run(list(argv), env=env, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


@needs_srun
def test_srun_help_lists_the_flags(slurm_conf):
    out = _run(slurm_conf(), "srun", "--help").stdout
    for flag in ("--container-image", "--container-mounts", "--container-workdir",
                 "--container-name", "--container-save", "--no-container-mount-home",
                 "--container-remap-root", "--container-entrypoint-log",
                 "--container-readonly", "--container-env", "--container-unshare",
                 "--container-device"):
        assert flag in out, flag


@needs_srun
@pytest.mark.parametrize("flag, message", [
    ("--container-mounts=/data:",
     "spank_berth: --container-mounts: missing destination in '/data:'"),
    ("--container-mounts=:/a", "missing source in ':/a'"),
    ("--container-mounts=/a:/b:ro+bogus", "unknown flag 'bogus'"),
    ("--container-image=", "--container-image: empty image"),
    ("--container-image=/nonexistent/x.sqsh", "no such file '/nonexistent/x.sqsh'"),
    ("--container-image=nvcr.io", "'nvcr.io' is a registry host without an image"),
    ("--container-workdir=", "--container-workdir: empty path"),
    ("--container-mounts=data", "'data' alone is also the destination"),
    ("--container-mounts=umount:/a:ro", "umount takes no flag but nofail"),
    ("--container-mounts=/tmp:mnt:ro",
     "--container-mounts: mount target must be a relative path or an absolute path"),
    ("--container-mounts=tmpfs:/t:size=1M+$(x)", "unknown tmpfs option '$(x)'"),
    ("--container-name=n:sometimes", "--container-name: unknown mode 'sometimes'"),
    ("--container-unshare=pid", "--container-unshare: unknown namespace 'pid'"),
    ("--container-env=1BAD", "--container-env: '1BAD' is not a variable name"),
    ("--container-device=nvidia.com/gpu", "--container-device: 'nvidia.com/gpu' is not a CDI "
     "device name (VENDOR/CLASS=NAME, as nvidia.com/gpu=0)"),
])
def test_srun_refuses_bad_flags_before_submission(slurm_conf, flag, message):
    result = _run(slurm_conf(), "srun", flag, "true")
    assert result.returncode != 0
    assert message in result.stderr
    # refused by the plugin, not by a failed attempt to reach slurmctld
    assert "slurmctld" not in result.stderr and "Unable to" not in result.stderr


def test_mount_flags_are_the_runtimes():
    """container_flags.c's known mount flags are exactly those berth start -m takes:
    none that fails the job on the node, none that srun refuses needlessly."""
    text = (SPANK / "container_flags.c").read_text()
    table = re.search(r"known_mount_flag.*?known\[\] = \{(.*?)\};", text, re.S).group(1)
    plugin = set(re.findall(r'"([^"]+)"', table))
    sys.path.insert(0, str(SPANK.parent / "runtime"))
    try:
        from berth.container import mounts
        from berth.errors import BerthError
    finally:
        sys.path.pop(0)
    runtime = set()
    for flag in mounts.FLAGS:
        try:
            mounts.parse_spec(f"/src:/dst:{flag}")
        except BerthError:  # fstab-only ones (x-move, x-detach)
            continue
        runtime.add(flag)
    assert plugin == runtime


def test_archive_image_forms_are_the_runtimes():
    """--container-image's archive prefixes (image_ref.c) are the archive
    schemes berth import reads: one the plugin lacked would be sent to a
    registry as docker://; one the runtime lacked would fail on the node."""
    text = (SPANK / "image_ref.c").read_text()
    table = re.search(r"image_archive_prefix.*?prefixes\[\] = \{(.*?)\};", text, re.S).group(1)
    plugin = set(re.findall(r'"([^"]+):"', table))
    sys.path.insert(0, str(SPANK.parent / "runtime"))
    try:
        from berth.image import archive
    finally:
        sys.path.pop(0)
    assert plugin == set(archive.SCHEMES)


def test_answer_keys_are_the_runtimes():
    """spank/answer_keys.h, which the plugin's answer parser is made of, is
    what scripts/answer_keys.py writes from the runtime's porcelain.KEYS."""
    result = subprocess.run([sys.executable, SPANK.parent / "scripts/answer_keys.py", "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# A reader of the runtime's answer lines, as the plugin reads them: each
# line of stdin parsed into one answer, its keys printed one a line (a
# path as hex, since it may hold any byte), or the parser's refusal.
ANSWER_READER = r"""
#include "answer.h"
#include <stdio.h>
#include <string.h>
int main(void)
{
    static char line[4 * PATH_MAX];
    char err[ERR_LEN];
    struct answer a;

    answer_init(&a);
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (answer_parse(line, &a, err, sizeof(err)) < 0) {
            printf("refused: %s\n", err);
            return 1;
        }
    if (ANSWER_HAS(&a, squashfs)) {
        printf("squashfs ");
        for (const char *p = a.squashfs; *p; p++)
            printf("%02x", (unsigned char)*p);
        printf("\n");
    }
    if (ANSWER_HAS(&a, digest))
        printf("digest %s\n", a.digest);
    if (ANSWER_HAS(&a, cached))
        printf("cached %d\n", a.cached);
    if (ANSWER_HAS(&a, pid))
        printf("pid %ld\n", (long)a.pid);
    return 0;
}
"""


@pytest.fixture(scope="module")
def answer_reader(tmp_path_factory):
    out = tmp_path_factory.mktemp("answer")
    (out / "reader.c").write_text(ANSWER_READER)
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", f"-I{SPANK}", "-o", out / "reader",
                    out / "reader.c", SPANK / "answer.c"], check=True)
    return out / "reader"


@pytest.mark.parametrize("path", [
    "/cache/images/plain.sqsh", "/home/a b/x.sqsh", "/tmp/new\nline=key%20x.sqsh",
    "/tmp/caf\u00e9/\udcff.sqsh",  # a name that is no UTF-8, as os.fsdecode gives it
    "/tmp/" + "\t\r\x7f\"'\\ " + "".join(map(chr, range(1, 32))),
])
def test_plugin_reads_what_the_runtime_answers(answer_reader, path):
    """The runtime's --porcelain lines (berth/porcelain.py) read back by the
    plugin's one parser (answer.c), whatever bytes the path holds: import's
    line, and a detached start's digest line then pid line."""
    sys.path.insert(0, str(SPANK.parent / "runtime"))
    try:
        from berth import porcelain
    finally:
        sys.path.pop(0)
    digest = "sha256:" + "0123456789abcdef" * 4
    imported = porcelain.line(squashfs=path, digest=digest, cached=False)
    assert imported.count("\n") == 1 and imported.count(" ") == 2
    read = subprocess.run([answer_reader], input=imported.encode(), capture_output=True)
    assert read.returncode == 0, read.stdout
    assert read.stdout.decode().splitlines() == [
        f"squashfs {os.fsencode(path).hex()}", f"digest {digest}", "cached 0"]
    started = porcelain.line(digest=digest, cached=True) + porcelain.line(pid=4242)
    read = subprocess.run([answer_reader], input=started.encode(), capture_output=True)
    assert read.stdout.decode().splitlines() == [f"digest {digest}", "cached 1", "pid 4242"]


def test_tasks_install_the_runtimes_seccomp_filter():
    """seccomp_filter.h, which joining tasks install, is the runtime's filter
    (berth/container/seccomp.py) instruction for instruction, on each architecture."""
    header = (SPANK / "seccomp_filter.h").read_text()
    sys.path.insert(0, str(SPANK.parent / "runtime"))
    try:
        from berth.container import seccomp
    finally:
        sys.path.pop(0)
    for machine, guard in (("x86_64", "__x86_64__"), ("aarch64", "__aarch64__")):
        block = re.search(rf"defined\({guard}\).*?seccomp_filter\[\] = \{{(.*?)\}};", header, re.S)
        rows = re.findall(r"\{ (0x[0-9a-f]+), (\d+), (\d+), (0x[0-9a-f]+) \}", block.group(1))
        assert [tuple(int(v, 0) for v in row) for row in rows] == seccomp.program(machine), machine


def _refused_by_plugin(result):
    return result.returncode != 0 and "spank_berth" in result.stderr


def _reached_the_controller(result):
    """Accepted by the plugin: srun went on to ask the (absent) slurmctld."""
    return "spank_berth" not in result.stderr and "slurm controller" in result.stderr


@needs_srun
@pytest.mark.parametrize("pair", [
    ("--container-writable", "--container-readonly"),
    ("--container-readonly", "--container-writable"),
    ("--container-mount-home", "--no-container-mount-home"),
    ("--no-container-remap-root", "--container-remap-root"),
    ("--container-entrypoint", "--no-container-entrypoint"),
])
def test_srun_refuses_contradictory_flags(slurm_conf, pair):
    result = _run(slurm_conf(), "srun", "--container-image=ubuntu", *pair, "true")
    assert _refused_by_plugin(result)
    assert f"spank_berth: {pair[0]} and {pair[1]} were both specified" in result.stderr


@needs_srun
def test_srun_accepts_what_pyxis_accepts(slurm_conf):
    # relative workdir (resolved inside), every --container-mounts form
    result = _run(slurm_conf(), "srun", "--container-image=ubuntu", "--container-workdir=../w",
                  "--container-mounts=/data,./d:/d,.:/work:ro+runbindable,tmpfs:/t:size=1M,"
                  "umount:/dev/shm,/tmp:./mnt,/tmp:../up", "true")
    assert _reached_the_controller(result), result.stderr


@needs_srun
@pytest.mark.parametrize("variables, message", [
    ({"PYXIS_CONTAINER_MOUNTS": "/a:/b"},
     "spank_berth: --container-mounts needs --container-image or --container-name"),
    ({"PYXIS_CONTAINER_MOUNTS": "/a:"},
     "spank_berth: PYXIS_CONTAINER_MOUNTS (as --container-mounts): missing destination"),
    ({"PYXIS_CONTAINER_IMAGE": "/nonexistent/x.sqsh"},
     "PYXIS_CONTAINER_IMAGE (as --container-image): no such file '/nonexistent/x.sqsh'"),
    ({"PYXIS_CONTAINER_NAME": "a:sometimes"},
     "PYXIS_CONTAINER_NAME (as --container-name): unknown mode 'sometimes'"),
    ({"PYXIS_CONTAINER_IMAGE": "ubuntu", "PYXIS_CONTAINER_REMAP_ROOT": "perhaps"},
     "spank_berth: PYXIS_CONTAINER_REMAP_ROOT: 'perhaps' is not a boolean"),
    ({"PYXIS_CONTAINER_IMAGE": "ubuntu", "PYXIS_CONTAINER_WRITABLE": "1",
      "PYXIS_CONTAINER_READONLY": "yes"},
     "PYXIS_CONTAINER_WRITABLE and PYXIS_CONTAINER_READONLY were both specified"),
    ({"PYXIS_CONTAINER_UNSHARE": "pid", "PYXIS_CONTAINER_IMAGE": "ubuntu"},
     "PYXIS_CONTAINER_UNSHARE (as --container-unshare): unknown namespace 'pid'"),
])
@pytest.mark.parametrize("command", ["srun", "sbatch", "salloc"])
def test_pyxis_variables_act_as_their_flags(slurm_conf, command, variables, message):
    argv = {"srun": ["true"], "sbatch": ["--wrap=true"], "salloc": ["true"]}[command]
    result = _run({**slurm_conf(), **variables}, command, *argv)
    assert _refused_by_plugin(result)
    assert message in result.stderr


@needs_srun
def test_pyxis_variables_unread_by_sbatch_when_sbatch_support_is_off(slurm_conf):
    env = {**slurm_conf("sbatch_support=no"), "PYXIS_CONTAINER_MOUNTS": "/a:rel"}
    assert _reached_the_controller(_run(env, "sbatch", "--wrap=true"))


@needs_srun
def test_a_flag_wins_over_its_pyxis_variable(slurm_conf):
    bad = {"PYXIS_CONTAINER_IMAGE": "/nonexistent/x.sqsh", "PYXIS_CONTAINER_MOUNTS": "/a:rel",
           "PYXIS_CONTAINER_READONLY": "1", "PYXIS_CONTAINER_MOUNT_HOME": "1"}
    result = _run({**slurm_conf(), **bad}, "srun", "--container-image=ubuntu",
                  "--container-mounts=/a:/b", "--container-writable",
                  "--no-container-mount-home", "true")
    assert _reached_the_controller(result), result.stderr


@needs_srun
def test_srun_refuses_container_flags_without_an_image(slurm_conf):
    result = _run(slurm_conf(), "srun", "--container-mounts=/a:/b", "true")
    assert result.returncode != 0
    assert "--container-mounts needs --container-image or --container-name" in result.stderr


@needs_srun
def test_sbatch_catches_image_truncated_by_a_hash_comment(slurm_conf, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --container-image nvcr.io#nvidia/cuda:12.9\ntrue\n")
    result = _run(slurm_conf(), "sbatch", str(script))
    assert result.returncode != 0
    assert "'nvcr.io' is a registry host without an image" in result.stderr


@needs_srun
@pytest.mark.parametrize("spelling", ['"/no#x.sqsh"', "/no\\#x.sqsh"])
def test_sbatch_keeps_a_quoted_or_escaped_hash(slurm_conf, tmp_path, spelling):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --container-image {spelling}\ntrue\n")
    result = _run(slurm_conf(), "sbatch", str(script))
    assert "--container-image: no such file '/no#x.sqsh'" in result.stderr


@needs_srun
def test_sbatch_flags_absent_when_sbatch_support_is_off(slurm_conf):
    result = _run(slurm_conf("sbatch_support=no"), "sbatch", "--container-image=x", "--wrap=true")
    assert result.returncode != 0
    assert "unrecognized option" in result.stderr


@needs_srun
@pytest.mark.parametrize("args, message", [
    (["runtime_pth=/run/x"], "plugstack.conf: unknown plugstack option 'runtime_pth'"),
    (["use_squashfuse=perhaps"], "use_squashfuse: 'perhaps' is not a boolean"),
    (["container_scope=node"], "container_scope: 'node' is neither job nor global"),
    (["container_prefix=a/b"], "container_prefix: 'a/b' is not 1 to 32 letters"),
])
def test_bad_plugstack_options_are_named(slurm_conf, args, message):
    result = _run(slurm_conf(*args), "srun", "true")
    assert result.returncode != 0
    assert message in result.stderr


# ---- a registry image's tag: resolved once at submission (SLURM_BERTH_IMAGE)


def _calls(tmp_path):
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


# srun collects its resolve once slurmctld has granted the allocation, which
# no slurmctld here ever does: spank/tests/e2e.sh runs srun's under a real Slurm.
@needs_srun
@pytest.mark.parametrize("command", ["sbatch", "salloc"])
def test_a_registry_image_is_resolved_once_at_submission(slurm_conf, tmp_path, command):
    argv = {"sbatch": ["--wrap=true"], "salloc": ["true"]}[command]
    result = _run(slurm_conf(), command, "--container-image=nvcr.io#nvidia/cuda:12.9", *argv)
    assert _reached_the_controller(result), result.stderr
    assert _calls(tmp_path) == ["import --resolve docker://nvcr.io#nvidia/cuda:12.9"]


@needs_srun
def test_a_step_of_a_job_of_the_same_image_keeps_its_resolution(slurm_conf, tmp_path):
    pinned = "docker://nvcr.io#nvidia/cuda@sha256:" + "1" * 64
    job = {**slurm_conf(), "SLURM_BERTH_IMAGE": f"docker://nvcr.io#nvidia/cuda:12.9\n{pinned}"}
    result = _run(job, "srun", "--container-image=nvcr.io#nvidia/cuda:12.9", "true")
    assert _reached_the_controller(result), result.stderr
    assert _calls(tmp_path) == []
    # another image than the job's: resolved for this submission (sbatch, which
    # waits for it; srun collects it after an allocation that never comes here)
    result = _run(job, "sbatch", "--container-image=ubuntu:24.04", "--wrap=true")
    assert _reached_the_controller(result), result.stderr
    assert _calls(tmp_path) == ["import --resolve docker://ubuntu:24.04"]


@needs_srun
def test_files_archives_and_an_importer_are_not_resolved(slurm_conf, tmp_path):
    image = tmp_path / "image.sqsh"
    image.write_bytes(b"")
    for flag in (f"--container-image={image}", "--container-image=docker-archive:a.tar",
                 "--container-name=kept"):
        assert _reached_the_controller(_run(slurm_conf(), "srun", flag, "true")), flag
    importer = slurm_conf(f"importer={tmp_path}/importer")
    assert _reached_the_controller(_run(importer, "srun", "--container-image=ubuntu", "true"))
    assert _calls(tmp_path) == []


@needs_srun
@pytest.mark.parametrize("plugstack", [[], ["berth=/nonexistent/berth"]])
def test_a_failed_resolve_warns_and_the_job_goes_on(slurm_conf, plugstack):
    result = _run(slurm_conf(*plugstack), "sbatch", "--container-image=fail.example#x:1",
                  "--wrap=true")
    reason = ("cannot reach the registry" if not plugstack
              else "cannot execute /nonexistent/berth")
    warning = (f"spank_berth: warning: cannot resolve docker://fail.example#x:1 to a digest "
               f"here ({reason}); each node imports the tag as it finds it then\n")
    assert result.stderr.count("spank_berth") == 1 and warning in result.stderr
    assert "slurm controller" in result.stderr  # submitted all the same


@needs_srun
def test_srun_resolves_during_its_allocation_and_leaves_none_behind(slurm_conf, tmp_path):
    # The stub's resolve of a *slow* tag takes 60 s: srun asks slurmctld
    # meanwhile (a listener that never answers: MessageTimeout=1), and when
    # no allocation comes, the resolve ends with srun. (Waiting for the
    # resolve first, srun would outlast _run's 30 s.)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = slurm_conf(conf_lines=f"SlurmctldPort={silent.getsockname()[1]}\n")
        result = _run(env, "srun", "--container-image=slow.example#x:1", "true")
    assert result.returncode != 0 and "spank_berth" not in result.stderr, result.stderr
    assert _calls(tmp_path) == ["import --resolve docker://slow.example#x:1"]
    pid = int((tmp_path / "calls.pid").read_text())
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the resolve (pid {pid}) outlived srun")


# ---- --environment: resolved by the runtime at submission, refused there


@pytest.fixture()
def edf_site(slurm_conf, tmp_path):
    """plugstack berth= pointing at this checkout's runtime; EDFs in tmp_path/edf."""
    runtime = tmp_path / "berth"
    runtime.write_text(f"#!/bin/sh\nPYTHONPATH={SPANK.parent / 'runtime'} "
                       f"exec {sys.executable} -m berth.cli \"$@\"\n")
    runtime.chmod(0o755)
    edf_dir = tmp_path / "edf"
    edf_dir.mkdir()
    env = {**slurm_conf(f"berth={runtime}"), "EDF_PATH": str(edf_dir),
           "ENROOT_SYSCONF_PATH": str(tmp_path / "sysconf")}
    return env, edf_dir


@needs_srun
def test_srun_help_lists_environment(slurm_conf):
    assert "--environment=NAME|PATH.toml" in _run(slurm_conf(), "srun", "--help").stdout


@needs_srun
@pytest.mark.parametrize("command", ["srun", "sbatch"])
@pytest.mark.parametrize("text, message", [
    ('imagee = "x"\n', "{path}:1: unknown key 'imagee'"),
    ('image = "x"\nworkdir = 3\n', "{path}:2: 'workdir' must be a string"),
    ('image = "x"\nmounts = ["/a:rel"]\n',
     "{path}:2: mount '/a:rel': destination 'rel' is not an absolute path"),
    ('image = "x"\nmounts = ["/a:/b:ro+bogus"]\n',
     "{path}:2: mount '/a:/b:ro+bogus': unknown mount flag 'bogus'"),
    # what only the plugin knows: files on this host
    ('image = "/nonexistent/x.sqsh"\n',
     "bad: --container-image: no such file '/nonexistent/x.sqsh'"),
    ('workdir = "/w"\n', "'bad' sets no image and no --container-image is given"),
])
def test_bad_environment_is_refused_before_submission(edf_site, command, text, message):
    env, edf_dir = edf_site
    path = edf_dir / "bad.toml"
    path.write_text(text)
    result = _run(env, command, "--environment=bad",
                  *(["true"] if command == "srun" else ["--wrap=true"]))
    assert result.returncode != 0
    assert f"spank_berth: --environment: {message.format(path=path)}" in result.stderr
    assert "slurmctld" not in result.stderr and "Unable to" not in result.stderr


@needs_srun
def test_missing_environment_names_where_it_looked(edf_site):
    env, edf_dir = edf_site
    result = _run(env, "srun", "--environment=nothere", "true")
    assert result.returncode != 0
    assert ("spank_berth: --environment: environment 'nothere' not found as nothere or "
            f"nothere.toml in: {edf_dir}") in result.stderr


@needs_srun
def test_unrunnable_runtime_is_named(slurm_conf, tmp_path):
    result = _run(slurm_conf(f"berth={tmp_path}/no-berth"), "srun", "--environment=x", "true")
    assert result.returncode != 0
    assert f"spank_berth: --environment: cannot execute {tmp_path}/no-berth" in result.stderr


@needs_srun
def test_an_edf_annotation_for_a_hook_not_installed_warns_and_the_job_goes_on(edf_site):
    """A portable EDF: the CSCS talk's Slingshot switch on a cluster without
    the CXI hook is one warning at submission, and the job is submitted."""
    env, edf_dir = edf_site
    path, image = edf_dir / "portable.toml", edf_dir / "app.sqsh"
    image.write_bytes(b"")  # (the plugin checks that it is there; no node reads it)
    path.write_text(f'image = "{image}"\n[annotations]\ncom.hooks.cxi.enable = true\n')
    result = _run(env, "sbatch", "--environment=portable", "--wrap=true")
    warning = (f"spank_berth: warning: --environment: {path}: annotation "
               f"'com.hooks.cxi.enable' is for hook 'cxi', which is not installed in "
               f"{env['ENROOT_SYSCONF_PATH']}/hooks.d (installed: none): left out\n")
    assert warning in result.stderr, result.stderr
    assert "slurm controller" in result.stderr  # submitted all the same
