"""enroot.conf loading: precedence, expansion, and refusal of unknown keys."""

import os

import pytest

from berth import config
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


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_bad_boolean_names_the_key(tmp_path, value):
    cfg = config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path),
                       "ENROOT_REMAP_ROOT": value})
    with pytest.raises(BerthError, match=f"ENROOT_REMAP_ROOT: expected yes or no, got '{value}'"):
        cfg.flag("ENROOT_REMAP_ROOT")


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    write(tmp_path / "enroot.conf", "ENROOT_DATA_PATH /d\n")
    (tmp_path / "enroot.conf.d").mkdir()
    (tmp_path / "enroot.conf.d/50-site.conf").write_bytes(b"# ok\nENROOT_DATA_PATH /\xe9t\xe9\n")
    with pytest.raises(BerthError, match=r"50-site.conf:2: not UTF-8 text"):
        config.load({"HOME": "/h", "ENROOT_SYSCONF_PATH": str(tmp_path)})
