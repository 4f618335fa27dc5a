"""The runtime called through a link named `enroot` (as the container_runtime
role installs it): the enroot verbs work and messages name `enroot`."""

import subprocess
import sys
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(tmp_path):
    script = tmp_path / "bin" / "berth"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom berth.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    (tmp_path / "bin" / "enroot").symlink_to("berth")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(RUNTIME), "HOME": str(tmp_path),
           **{f"ENROOT_{key}_PATH": str(tmp_path / key.lower())
              for key in ("SYSCONF", "CONFIG", "DATA", "RUNTIME", "CACHE")}}
    (tmp_path / "data").mkdir(mode=0o700)

    def run(name, *args):
        return subprocess.run([str(tmp_path / "bin" / name), *args], env=env,
                              capture_output=True, text=True, check=False)
    return run


def test_messages_name_the_command_it_was_called_as(run):
    for name in ("enroot", "berth"):
        failed = run(name, "remove", "-f", "nope")
        assert failed.returncode == 1
        assert failed.stderr.startswith(f"{name}: error: no container named 'nope'"), failed.stderr
        assert run(name, "--help").stdout.startswith(f"usage: {name} ")
        assert run(name, "bogus").stderr.splitlines()[0].startswith(f"usage: {name} ")


def test_enroot_verbs(run):
    assert run("enroot", "list").stdout == ""
    assert run("enroot", "list", "-f").stdout.split() == [
        "NAME", "PID", "COMM", "STATE", "STARTED", "TIME", "MNTNS", "USERNS", "COMMAND"]
    assert run("enroot", "version").returncode == 0
    for verb in ("import", "create", "start", "exec", "export", "remove", "batch"):
        usage = run("enroot", verb, "--help")
        assert usage.returncode == 0 and usage.stdout.startswith(f"usage: enroot {verb}")
