"""hooks/80-slurm.sh in real starts: the node's Slurm client commands (this
machine's slurm-client) inside a container of busybox alone, an image with
no C library at all, so that they can only run through the node's loader
and libraries the hook binds. No controller runs here: `--version` is what
the commands can answer; the multinode scenario runs steps and jobs
(molecule/multinode/tests/test_spank.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOKS = REPO / "hooks"


def host_version(node, command):
    """What the node's own `COMMAND --version` prints."""
    return subprocess.run([command, "--version"], capture_output=True, text=True, check=True,
                          env={**os.environ, "SLURM_CONF": str(node / "slurm/slurm.conf")}).stdout


@pytest.fixture
def node(tmp_path):
    """A runtime configuration with the Slurm hook installed, a busybox
    container `app`, and a slurm.conf (what srun reads before anything)."""
    sysconf = tmp_path / "sys"
    (sysconf / "hooks.d").mkdir(parents=True)
    for name in ("80-slurm.sh", "common.bash"):
        shutil.copy(HOOKS / name, sysconf / "hooks.d" / name)
    root = tmp_path / "data" / "app"
    for directory in ("bin", "etc", "proc", "dev", "sys", "tmp", "usr/local/bin"):
        (root / directory).mkdir(parents=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in subprocess.run([busybox, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    conf = tmp_path / "slurm" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("ClusterName=hooktest\nSlurmctldHost=localhost\nSlurmUser=daemon\n"
                    "NodeName=n1\nPartitionName=p Nodes=n1\n")
    return tmp_path


def start(node, *command, env=None, options=()):
    """`berth start OPTIONS app COMMAND` with the hook's variables in `env`
    (the caller's: a job's environment), SLURM_CONF as a job on the node has
    it (the caller's and the container's)."""
    conf = str(node / "slurm/slurm.conf")
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO / "runtime"),
            "ENROOT_SYSCONF_PATH": str(node / "sys"), "ENROOT_DATA_PATH": str(node / "data"),
            "ENROOT_RUNTIME_PATH": str(node / "run"), "ENROOT_CONFIG_PATH": str(node / "cfg"),
            "ENROOT_CACHE_PATH": str(node / "cache"), "SLURM_CONF": conf}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from berth.cli import main; sys.exit(main())",
         "start", "-e", f"SLURM_CONF={conf}", *options, "app", *command],
        capture_output=True, text=True, env={**base, **(env or {})}, timeout=60, check=False)


ON = {"BERTH_HOOK_SLURM_ENABLE": "yes"}


def test_the_nodes_commands_run_in_an_image_without_a_c_library(node):
    result = start(node, "sh", "-c", "srun --version; sbatch --version; squeue --version; "
                   "head -n1 /usr/local/bin/srun", env=ON)
    assert result.returncode == 0, result.stderr
    srun, sbatch, squeue, shebang = result.stdout.splitlines()
    assert srun + "\n" == host_version(node, "srun")
    assert sbatch + "\n" == host_version(node, "sbatch") and squeue + "\n" == host_version(node, "squeue")
    assert shebang == "#!/bin/sh"  # the wrapper through the node's loader
    assert result.stderr == ""
    # The commands refuse a configuration whose SlurmUser they cannot look
    # up: the node's entry joins the container's /etc/passwd, not the image's.
    passwd = start(node, "cat", "/etc/passwd", env=ON).stdout.splitlines()
    assert passwd == ["root:x:0:0:root:/root:/bin/sh",
                      subprocess.check_output(["getent", "passwd", "daemon"], text=True).strip()]
    assert (node / "data/app/etc/passwd").read_text() == "root:x:0:0:root:/root:/bin/sh\n"
    # The image's LD_PRELOAD would load into the node's commands: not given to them.
    result = start(node, "srun", "--version", env=ON,
                   options=("-e", "LD_PRELOAD=/no/such/library.so"))
    assert result.returncode == 0 and result.stdout == host_version(node, "srun")
    assert "preload" not in result.stderr.lower()


def test_off_unless_the_site_the_job_or_the_edf_turns_it_on(node):
    result = start(node, "srun", "--version")
    assert result.returncode == 127  # not there: the hook is off by default
    (node / "sys/enroot.conf").write_text("BERTH_HOOK_SLURM_ENABLE yes\n")
    assert start(node, "srun", "--version").stdout == host_version(node, "srun")
    # The job's environment over the site's default (EDF annotations arrive
    # the same way, as 1 or 0, from the plugin, over the job's). What is
    # left is the empty mount point the last start made, as with enroot.
    for off in ("0", "False", "no"):
        result = start(node, "srun", "--version", env={"BERTH_HOOK_SLURM_ENABLE": off})
        assert result.returncode == 126 and result.stdout == ""
    assert (node / "data/app/usr/local/bin/srun").stat().st_size == 0


def test_an_images_own_srun_is_kept_unless_replaced(node):
    own = node / "data/app/usr/local/bin/srun"
    own.write_text("#!/bin/sh\necho image-srun\n")
    own.chmod(0o755)
    result = start(node, "srun", "--version", env=ON)
    assert result.stdout == "image-srun\n"
    assert result.stderr == ("slurm hook: the image has its own /usr/local/bin/srun; the node's "
                             "commands are not bound (com.hooks.slurm.replace = true binds them "
                             "over it)\n")
    result = start(node, "srun", "--version", env={**ON, "BERTH_HOOK_SLURM_REPLACE": "1"})
    assert result.returncode == 0 and result.stdout == host_version(node, "srun")
    assert own.read_text() == "#!/bin/sh\necho image-srun\n"  # bound over, not written
    # An empty file is the mount point an earlier start of this container
    # left (binds leave theirs, as enroot's do), not a Slurm of the image.
    own.write_text("")
    result = start(node, "srun", "--version", env=ON)
    assert result.returncode == 0 and result.stdout == host_version(node, "srun"), result.stderr


@pytest.mark.parametrize("env, needle", [
    ({"BERTH_HOOK_SLURM_ENABLE": "maybe"}, "BERTH_HOOK_SLURM_ENABLE: expected yes or no, got 'maybe'"),
    ({**ON, "BERTH_HOOK_SLURM_REPLACE": "2"}, "BERTH_HOOK_SLURM_REPLACE: expected yes or no, got '2'"),
    ({**ON, "SLURM_CONF": "/etc/slurm x/slurm.conf"},
     "SLURM_CONF: '/etc/slurm x/slurm.conf' is not an absolute path without spaces"),
    ({**ON, "SLURM_CONF": "/etc/slurm\n/etc/shadow /x none bind"},
     "SLURM_CONF: '/etc/slurm?/etc/shadow /x none bind' is not an absolute path without spaces"),
    ({**ON, "SLURM_CONF": "slurm.conf"}, "SLURM_CONF: 'slurm.conf' is not an absolute path"),
    ({**ON, "BERTH_SLURM_PATH": "/nonexistent"},
     "it is on (BERTH_HOOK_SLURM_ENABLE), but this node has no srun in /nonexistent (BERTH_SLURM_PATH)"),
    ({**ON, "BERTH_LDCONFIG": "false"}, "BERTH_LDCONFIG: 'false' failed"),
    ("SlurmUser=berth-no-such-user", "{conf}: SlurmUser berth-no-such-user is no user of this node"),
    ("SlurmUser=a:b", "{conf}: SlurmUser 'a:b' is not a user name"),
])
def test_a_bad_setting_fails_the_start_in_one_line(node, env, needle):
    conf = node / "slurm/slurm.conf"
    if isinstance(env, str):  # a line of the node's slurm.conf
        conf.write_text(conf.read_text().replace("SlurmUser=daemon", env))
        env = ON
    result = start(node, "sh", "-c", "echo ran", env=env)
    assert result.returncode == 1 and result.stdout == ""
    # one line: the runtime's, with the hook's reason (the line a Slurm step shows)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"berth: error: hook 80-slurm.sh: slurm hook: {needle.format(conf=conf)}")


def test_an_image_without_a_shell_is_refused_in_one_line(node):
    (node / "data/app/bin/sh").unlink()
    result = start(node, "/bin/busybox", "echo", "ran", env=ON)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == ["berth: error: hook 80-slurm.sh: slurm hook: the image "
                                          "has no /bin/sh to run the node's Slurm commands through"]


def test_an_image_whose_link_leads_out_of_its_root_gets_no_wrappers(node, tmp_path_factory):
    """The wrappers are written into the container's root: an image whose
    /usr/local is a link out of it (here to a directory of the host) is
    refused in one line, and nothing is bound."""
    outside = tmp_path_factory.mktemp("outside")
    local = node / "data/app/usr/local"
    (local / "bin").rmdir()
    local.rmdir()
    local.symlink_to(outside)
    result = start(node, "sh", "-c", "echo ran", env=ON)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == ["berth: error: hook 80-slurm.sh: slurm hook: "
                                          "/usr/local/berth/slurm/sbin: a link of the image leads "
                                          "it out of the container's root"]
    assert list(outside.iterdir()) == []  # nothing made there
