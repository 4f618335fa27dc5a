"""The choice of the squashfs server (squashserve.py), from stand-in
executables on PATH that carry what the real ones' bytes tell."""

import pytest

from berth import cli
from berth.image import imagefile, squashserve

# what each squashfuse release's executables hold, as far as the choice reads them
DEBIAN_12 = {"squashfuse_ll": b"offset=%zu fuse_session_loop",
             "squashfuse": b"offset=%zu fuse_main_real"}
DEBIAN_13 = {"squashfuse_ll": b"-o uid=N  set file owner fuse_session_loop_mt_32",
             "squashfuse": b"-o uid=N fuse_main_real_versioned"}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """installed(programs): those stand-ins alone on PATH, the choice made afresh."""
    def install(programs):
        for name, content in programs.items():
            program = tmp_path / name
            program.write_bytes(b"\x7fELF " + content)
            program.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        squashserve.choose.cache_clear()
    yield install
    squashserve.choose.cache_clear()


def test_debian_13_serves_everything_with_the_threaded_low_level_server(installed):
    installed(DEBIAN_13)
    image = imagefile.Squashfs("/images/a.sif", 4096)
    assert squashserve.argv(image, (1000, 100)) == [
        "squashfuse_ll", "-f", "-o", "uid=1000,gid=100,offset=4096", "/images/a.sif"]
    assert squashserve.choose(True).threads and squashserve.choose(False).threads
    assert squashserve.argv(imagefile.Squashfs("/a.sqsh"), foreground=False) == [
        "squashfuse_ll", "/a.sqsh"]


def test_debian_12_keeps_the_high_level_server_where_owners_are_shown_as_the_caller(installed):
    installed(DEBIAN_12)
    assert squashserve.argv(imagefile.Squashfs("/a.sqsh"), (0, 0)) == [
        "squashfuse", "-f", "-o",
        "kernel_cache,entry_timeout=86400,attr_timeout=86400,negative_timeout=86400,uid=0,gid=0",
        "/a.sqsh"]
    assert squashserve.argv(imagefile.Squashfs("/a.sqsh")) == ["squashfuse_ll", "-f", "/a.sqsh"]
    assert not squashserve.choose(False).threads


def test_the_low_level_server_alone_serves_all(installed):
    installed({"squashfuse_ll": DEBIAN_12["squashfuse_ll"]})
    assert squashserve.argv(imagefile.Squashfs("/a.sqsh"), (5, 5))[0] == "squashfuse_ll"


def test_berth_verbose_version_names_the_servers(installed, capsys):
    installed(DEBIAN_12)
    assert cli.main(["--verbose", "version"]) == 0
    version, servers = capsys.readouterr().out.splitlines()
    assert version == cli.__version__
    assert servers == ("squashfs: a container's root by squashfuse (one thread, kernel_cache,"
                       "entry_timeout=86400,attr_timeout=86400,negative_timeout=86400); "
                       "others by squashfuse_ll (one thread)")
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out == f"{cli.__version__}\n"
