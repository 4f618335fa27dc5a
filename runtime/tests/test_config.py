"""enroot.conf loading: precedence, expansion, and refusal of unknown keys."""

import grp
import os
import pwd
import subprocess

import pytest

from berth import cli, config, confvalue
from berth.errors import BerthError


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_defaults_follow_xdg(tmp_path):
    cfg = config.load({"HOME": "/home/u", "XDG_CACHE_HOME": "/c",
                       "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert cfg["ENROOT_CACHE_PATH"] == "/c/enroot"
    assert cfg["ENROOT_DATA_PATH"] == "/home/u/.local/share/enroot"
    assert cfg["ENROOT_SQUASH_OPTIONS"].startswith("-comp zstd")


def test_file_then_dropin_then_environment(tmp_path):
    write(tmp_path / "enroot.conf", "ENROOT_MAX_CONNECTIONS 4\nENROOT_ALLOW_HTTP yes # trailing\n")
    write(tmp_path / "enroot.conf.d/50-site.conf", "ENROOT_MAX_CONNECTIONS 6\n")
    env = {"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)}
    assert config.load(env).number("ENROOT_MAX_CONNECTIONS") == 6
    assert config.load(env).flag("ENROOT_ALLOW_HTTP") is True
    env["ENROOT_MAX_CONNECTIONS"] = "9"
    assert config.load(env).number("ENROOT_MAX_CONNECTIONS") == 9


def test_values_expand_variables_and_the_caller(tmp_path):
    write(tmp_path / "enroot.conf",
          "ENROOT_CACHE_PATH ${SCRATCH}/cache\nENROOT_DATA_PATH /data/user-${UID}\n")
    cfg = config.load({"HOME": "/h", "SCRATCH": "/scratch", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert cfg["ENROOT_CACHE_PATH"] == "/scratch/cache"
    assert cfg["ENROOT_DATA_PATH"] == f"/data/user-{os.getuid()}"


def test_unknown_key_names_file_line_and_key(tmp_path):
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\n\nENROOT_DATAPATH /x\n")
    with pytest.raises(BerthError,
                       match=r"enroot.conf:3: unknown configuration key 'ENROOT_DATAPATH'"):
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})


def test_zstd_options_are_refused_naming_file_line_and_key(tmp_path):
    """Berth never compresses with zstd: a site setting enroot's options
    for it is told so, not left expecting an effect."""
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\nENROOT_ZSTD_OPTIONS -19\n")
    with pytest.raises(BerthError) as refused:
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert str(refused.value).startswith(
        f"{tmp_path}/enroot.conf:2: ENROOT_ZSTD_OPTIONS is not supported: Berth compresses "
        "nothing with zstd")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("key", ["ENROOT_BUNDLE_ALL", "ENROOT_BUNDLE_CHECKSUM"])
def test_enroot_4s_bundle_keys_are_refused_saying_why(tmp_path, key):
    write(tmp_path / "enroot.conf", f"{key} yes\n")
    with pytest.raises(BerthError) as refused:
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert str(refused.value) == (f"{tmp_path}/enroot.conf:1: {key} is not supported: "
                                  "Berth makes no bundles (enroot bundle is not supported)")


def test_enroot_4s_keys_load_from_an_enroot_conf(tmp_path):
    """enroot 4's enroot.conf, its settings uncommented, loads (but bundles)."""
    write(tmp_path / "enroot.conf", "ENROOT_NATIVE_OVERLAYFS no\nENROOT_UNSHARE_UTS yes\n"
                                    "https_proxy http://proxy.example:3128\nno_proxy .example\n"
                                    "SSL_CERT_DIR /etc/ssl/certs\n")
    cfg = config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert cfg.flag("ENROOT_NATIVE_OVERLAYFS") is False
    assert cfg.network_environment() == {"https_proxy": "http://proxy.example:3128",
                                         "no_proxy": ".example", "SSL_CERT_DIR": "/etc/ssl/certs"}


def test_nvidia_and_mellanox_keys_are_the_hooks_variables(tmp_path):
    """enroot exports an enroot.conf's NVIDIA_* and MELLANOX_* keys for its
    hooks (a site's GPU and HCA defaults); a variable already set in the
    environment wins, as enroot's export keeps it."""
    write(tmp_path / "enroot.conf", "NVIDIA_DRIVER_CAPABILITIES compute,utility\n"
                                    "MELLANOX_VISIBLE_DEVICES=all\nNVIDIA_VISIBLE_DEVICES 0\n")
    cfg = config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path),
                       "NVIDIA_VISIBLE_DEVICES": "1,2"})
    assert {key: value for key, value in cfg.items() if config.is_hook_variable(key)} == {
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "MELLANOX_VISIBLE_DEVICES": "all",
        "NVIDIA_VISIBLE_DEVICES": "1,2"}


def test_a_hook_variable_that_is_no_variable_name_is_refused(tmp_path):
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\nNVIDIA_VISIBLE.DEVICES all\n")
    with pytest.raises(BerthError) as refused:
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert str(refused.value) == (f"{tmp_path}/enroot.conf:2: NVIDIA_VISIBLE.DEVICES: "
                                  "not a variable name")


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_bad_boolean_names_the_key(tmp_path, value):
    cfg = config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path),
                       "ENROOT_REMAP_ROOT": value})
    with pytest.raises(BerthError, match=f"ENROOT_REMAP_ROOT: expected yes or no, got '{value}'"):
        cfg.flag("ENROOT_REMAP_ROOT")


@pytest.mark.parametrize("line, message", [
    ("ENROOT_REMAP_ROOT maybe", "ENROOT_REMAP_ROOT: expected yes or no, got 'maybe'"),
    ("BERTH_HOOK_SLURM_ENABLE often", "BERTH_HOOK_SLURM_ENABLE: expected yes or no, got 'often'"),
    # enroot.conf's comment says 0 is no limit; enroot's own import fails on
    # it (mksquashfs takes -processors 1 or more, its zstd -T divides by it)
    ("ENROOT_MAX_PROCESSORS 0", "ENROOT_MAX_PROCESSORS: expected 1 or more, got '0'"),
    ("ENROOT_MAX_CONNECTIONS 0", "ENROOT_MAX_CONNECTIONS: expected 1 or more, got '0'"),
    ("ENROOT_TRANSFER_RETRIES ten", "ENROOT_TRANSFER_RETRIES: expected a number, got 'ten'"),
])
def test_a_files_bad_value_is_refused_naming_file_line_and_key(tmp_path, line, message):
    """Found when the file is read, by every command, not only by the first
    one that reads the key (and then without the file and line)."""
    write(tmp_path / "enroot.conf", f"ENROOT_DATA_PATH /d\n{line}\n")
    with pytest.raises(BerthError) as refused:
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
    assert str(refused.value) == f"{tmp_path}/enroot.conf:2: {message}"


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\n")
    (tmp_path / "enroot.conf.d").mkdir()
    (tmp_path / "enroot.conf.d/50-site.conf").write_bytes(b"# ok\nENROOT_DATA_PATH /\xe9t\xe9\n")
    with pytest.raises(BerthError, match=r"50-site.conf:2: not UTF-8 text"):
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})


def load_conf(tmp_path, text, **env):
    write(tmp_path / "enroot.conf", text)
    return config.load({"HOME": "/home/u", "ENROOT_SYSCONF_PATH": str(tmp_path), **env})


# The lines most sites copied from pyxis's setup guide, and enroot's own
# $(nproc): per-user and per-group paths made by commands.
PYXIS_GUIDE_CONF = """\
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
ENROOT_CACHE_PATH /raid/enroot-cache/group-$(id -g)
ENROOT_DATA_PATH /tmp/enroot-data/user-$(id -u)
ENROOT_TEMP_PATH ${TMPDIR:-/tmp}
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
ENROOT_MOUNT_HOME y
ENROOT_RESTRICT_DEV y
ENROOT_ROOTFS_WRITABLE y
ENROOT_MAX_PROCESSORS $(nproc)
"""


def test_the_pyxis_guides_enroot_conf_reads_as_enroot_reads_it(tmp_path):
    cfg = load_conf(tmp_path, PYXIS_GUIDE_CONF)
    assert cfg["ENROOT_RUNTIME_PATH"] == f"/run/enroot/user-{os.geteuid()}"
    assert cfg["ENROOT_CACHE_PATH"] == f"/raid/enroot-cache/group-{os.getegid()}"
    assert cfg["ENROOT_DATA_PATH"] == f"/tmp/enroot-data/user-{os.geteuid()}"
    assert cfg["ENROOT_TEMP_PATH"] == "/tmp"
    assert cfg["ENROOT_SQUASH_OPTIONS"] == "-noI -noD -noF -noX -no-duplicates"
    assert cfg.flag("ENROOT_MOUNT_HOME") and cfg.flag("ENROOT_ROOTFS_WRITABLE")
    assert cfg.number("ENROOT_MAX_PROCESSORS") == len(os.sched_getaffinity(0))
    moved = load_conf(tmp_path, PYXIS_GUIDE_CONF, TMPDIR="/scratch")
    assert moved["ENROOT_TEMP_PATH"] == "/scratch"


def test_names_of_the_caller_and_its_group_come_from_the_system(tmp_path):
    """$(id -un) and $(id -gn) are the process's, whatever USER says."""
    cfg = load_conf(tmp_path, "ENROOT_DATA_PATH /d/$(id -un)\nENROOT_CACHE_PATH /c/$(id -gn)\n"
                              "ENROOT_TEMP_PATH /t/$(whoami)\n", USER="root", UID="0")
    assert cfg["ENROOT_DATA_PATH"] == f"/d/{pwd.getpwuid(os.geteuid()).pw_name}"
    assert cfg["ENROOT_CACHE_PATH"] == f"/c/{grp.getgrgid(os.getegid()).gr_name}"
    assert cfg["ENROOT_TEMP_PATH"] == f"/t/{pwd.getpwuid(os.geteuid()).pw_name}"


# Values and what bash's `set -u; eval echo VALUE` prints for them (what
# enroot reads), checked against bash itself below.
SHELL_VALUES = [
    "~/.local/share/enroot", "~", "a~/b", "${HOME}/x", "$HOME/x", "${SCRATCH}/x", "$SCRATCH/x",
    '"$SCRATCH/x"', "'$SCRATCH  x'", "${NOPE:-/tmp}", "${EMPTY:-/d}", "${EMPTY-/d}",
    "${NOPE-$HOME/d}", "${NOPE:-~/d}", '"a  b"  c', "a\\ \\ b", "\\$HOME", "x#y",
    "-comp lzo  # fast", '"-n"x', "a=b,c:d", "$ /x$", '"\\$x \\a"', '""', "/run/user-$(id -u)/x",
    '"$(id -u)"', "$(id  -g )",
]


def bash_reads(value, env):
    run = subprocess.run(["bash", "-c", 'set -u; eval echo "$1"', "bash", value],
                         env=env, capture_output=True, text=True, check=False)
    return run.stdout.removesuffix("\n") if run.returncode == 0 else None


@pytest.mark.parametrize("value", SHELL_VALUES + ["${NOPE}/x", "$NOPE", '"${NOPE}"'])
def test_a_value_reads_as_enroots_shell_reads_it(value):
    env = {"HOME": "/home/u", "SCRATCH": "/scratch/a  b", "EMPTY": "", "PATH": "/usr/bin:/bin"}
    assert confvalue.read(value, env) == bash_reads(value, env)


def test_a_value_naming_an_unset_variable_leaves_the_default(tmp_path):
    """enroot's `set -u` shell fails on it, and enroot keeps its default."""
    text = "ENROOT_DATA_PATH ${XDG_DATA_HOME}/enroot\nENROOT_CACHE_PATH\n"
    cfg = load_conf(tmp_path, text)
    assert cfg["ENROOT_DATA_PATH"] == "/home/u/.local/share/enroot"
    assert cfg["ENROOT_CACHE_PATH"] == "/home/u/.cache/enroot"
    assert load_conf(tmp_path, text, XDG_DATA_HOME="/x")["ENROOT_DATA_PATH"] == "/x/enroot"


def test_a_line_reads_keys_set_before_it_and_takes_key_equals_value(tmp_path):
    cfg = load_conf(tmp_path, "ENROOT_CACHE_PATH=/c/$(id -u)\n"
                              "ENROOT_TEMP_PATH = ${ENROOT_CACHE_PATH}/tmp\n")
    assert cfg["ENROOT_TEMP_PATH"] == f"/c/{os.geteuid()}/tmp"


def test_the_environment_still_wins_over_a_value_with_a_command(tmp_path):
    cfg = load_conf(tmp_path, PYXIS_GUIDE_CONF, ENROOT_DATA_PATH="/mine")
    assert cfg["ENROOT_DATA_PATH"] == "/mine"


@pytest.mark.parametrize("value, why", [
    ("/d/$(hostname)", "'$(hostname)' is not read: of commands, only $(id -u), "),
    ("/d/`id -u`", "'`' is a command substitution, which is not read"),
    ('"/d/`id -u`"', "'`' is a command substitution, which is not read"),
    ("/d/$(id -u; id -g)", "'$(id -u; id -g)' is not read"),
    ("/d/$((1+1))", "is not read: of commands"),
    ("/d;touch /tmp/x", "';' is a command separator to enroot's shell; quote it"),
    ("/d && true", "'&' is a command separator"),
    ("/d | cat", "'|' is a pipe"),
    ("/d>/tmp/x", "'>' is a redirection"),
    ("/d/*", "'*' is a glob to enroot's shell; quote it"),
    ("/d/user?", "'?' is a glob"),
    ("/d/[ab]", "'[' is a glob"),
    ("/d/{a,b}", "'{' is a brace expansion"),
    ("~root/d", "only ~ and ~/ are read, not ~NAME"),
    ("/d/$1", "'$1' is not read"),
    ("/d/$$", "'$$' is not read"),
    ("$'/d'", "'$'' is not read"),
    ("/d/${HOME:+x}", "'${HOME' is not read: only ${NAME}, ${NAME:-word} and ${NAME-word}"),
    ("/d/${HOME", "'${HOME' is not read"),
    ("/d/${NOPE:-'x'}", "''' inside ${...} is not read"),
    ("'/d", "a ' quote is not closed"),
    ('"/d', 'a " quote is not closed'),
    ("/d\\", "a \\ ends the value"),
    ("-e /d", "'-e' as the first word is an option to enroot's echo"),
])
def test_other_shell_is_refused_naming_file_line_and_key(tmp_path, value, why):
    with pytest.raises(BerthError) as refused:
        load_conf(tmp_path, f"# site\nENROOT_DATA_PATH {value}\n")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path}/enroot.conf:2: ENROOT_DATA_PATH: ")
    assert why in message
    assert "\n" not in message


def test_a_refused_value_is_one_error_line_of_the_command(tmp_path, monkeypatch, capsys):
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\n\nENROOT_CACHE_PATH /c/`id -u`\n")
    monkeypatch.setenv("ENROOT_SYSCONF_PATH", str(tmp_path))
    assert cli.main(["list"]) != 0
    err = capsys.readouterr().err
    assert err.startswith(f"berth: error: {tmp_path}/enroot.conf:3: ENROOT_CACHE_PATH: '`' is")
    assert err.count("\n") == 1


def test_a_users_variables_are_text_never_shell(tmp_path):
    """The hostile user: the environment a site's value reads is the
    user's. Whatever it holds stays text: no command runs, no glob or
    quote acts, and UID or USER set by hand do not change $(id -u)."""
    marker = tmp_path / "ran"
    hostile = f"$(touch {marker})`touch {marker}`;*'\"${{HOME}}"
    (tmp_path / "one").touch()
    cfg = load_conf(tmp_path, "ENROOT_CACHE_PATH ${SCRATCH}/cache\n"
                              'ENROOT_TEMP_PATH "${SCRATCH:-/tmp}"\n'
                              "ENROOT_DATA_PATH /d/user-$(id -u)/$(id -un)\n",
                    SCRATCH=hostile, UID="0", USER="root")
    assert cfg["ENROOT_CACHE_PATH"] == f"{hostile}/cache"
    assert cfg["ENROOT_TEMP_PATH"] == hostile
    assert cfg["ENROOT_DATA_PATH"] == (f"/d/user-{os.geteuid()}/"
                                       f"{pwd.getpwuid(os.geteuid()).pw_name}")
    assert not marker.exists()
