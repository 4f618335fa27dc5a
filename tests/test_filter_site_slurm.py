"""plugins/filter/berth_site_slurm.py: what the adopt role reads of a Slurm
the site runs (scontrol show config, Prolog, plugstack.conf)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("berth_site_slurm", REPO / "plugins/filter/berth_site_slurm.py")
site_slurm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_slurm)

SHOW_CONFIG = """Configuration data as of 2026-01-01T00:00:00
Epilog                  = (null)
PlugStackConfig         = /etc/slurm/plugstack.conf
Prolog                  = /etc/slurm/prolog.d/*
SLURM_VERSION           = 22.05.8

Cgroup Support Configuration:
AllowedRAMSpace         = 100.0%
Prolog                  = not the main section's
"""


# as Debian 13's Slurm 24.11.5 shows two Prolog lines and a comma list (measured)
SHOW_CONFIG_24_11 = """Configuration data as of 2026-12-02T14:40:00
Epilog[0]               = /etc/slurm/site-epilog.sh,/etc/slurm/epilog.d/*
EpilogMsgTime           = 2000 usec
Prolog[0]               = /etc/slurm/site-prolog.sh
Prolog[1]               = /etc/slurm/prolog.d/*
PrologEpilogTimeout     = 65534
PrologFlags             = (null)
SLURM_VERSION           = 24.11.5

Cgroup Support Configuration:
Prolog[0]               = not the main section's
"""


def test_scontrol_config_gathers_numbered_lines():
    config = site_slurm.berth_scontrol_config(SHOW_CONFIG_24_11)
    assert config["Prolog"] == ["/etc/slurm/site-prolog.sh", "/etc/slurm/prolog.d/*"]
    assert config["Epilog"] == ["/etc/slurm/site-epilog.sh,/etc/slurm/epilog.d/*"]
    assert "PrologFlags" not in config
    assert site_slurm.berth_runs_path(config["Prolog"], "/etc/slurm/prolog.d/50-berth-user-dirs.sh")
    assert not site_slurm.berth_runs_path(config["Prolog"][:1], "/etc/slurm/prolog.d/50-berth-user-dirs.sh")


def test_scontrol_config_reads_the_main_section_first():
    config = site_slurm.berth_scontrol_config(SHOW_CONFIG)
    assert config["Prolog"] == "/etc/slurm/prolog.d/*"
    assert "Epilog" not in config and config["SLURM_VERSION"] == "22.05.8"  # (null): unset
    assert "Configuration" not in config


@pytest.mark.parametrize("setting, runs", [
    ("/etc/slurm/prolog.d/*", True),
    ("/etc/slurm/prolog.d/50-berth-user-dirs.sh", True),
    ("/etc/slurm/prolog.d/[0-9]*", True),
    ("/etc/slurm/prolog.sh", False),
    ("(null)", False),
    ("", False),
    # 22.05 globs the whole value: a comma list matches nothing and fails the prolog
    ("/etc/slurm/prolog.sh,/etc/slurm/prolog.d/*", False),
])
def test_runs_path(setting, runs):
    assert site_slurm.berth_runs_path(setting, "/etc/slurm/prolog.d/50-berth-user-dirs.sh") is runs


def test_pyxis_lines_only_live_ones():
    text = ("required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis\n"
            "# required /usr/lib/spank_pyxis.so\n"
            "optional spank_pyxis.so\n"
            "required /usr/lib/spank_berth.so\n")
    assert site_slurm.berth_pyxis_lines(text) == [
        "required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis", "optional spank_pyxis.so"]


@pytest.mark.parametrize("text, loads", [
    ("include /etc/slurm/plugstack.conf.d/*.conf\n", True),
    ("Include /etc/slurm/plugstack.conf.d/berth.conf\n", True),
    ("include /etc/slurm/plugstack.conf.d/pyxis.conf\n", False),
    ("# include /etc/slurm/plugstack.conf.d/*.conf\n", False),
    ("", False),
])
def test_plugstack_loads(text, loads):
    assert site_slurm.berth_plugstack_loads(text, "/etc/slurm/plugstack.conf.d/berth.conf") is loads


ENROOT_CONF = """# the site's
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
ENROOT_CACHE_PATH /raid/enroot-cache/group-$(id -g)   # pyxis's setup guide
#ENROOT_DATA_PATH /raid/enroot-data
ENROOT_DATA_PATH /raid/enroot-data
ENROOT_CONFIG_PATH ${HOME}/.config/enroot
ENROOT_SQUASH_OPTIONS -noI -noD
ENROOT_TEMP_PATH /tmp
"""


def test_enroot_paths_users_would_share_are_named_by_line():
    assert site_slurm.berth_shared_enroot_paths(ENROOT_CONF) == [
        "3: ENROOT_CACHE_PATH /raid/enroot-cache/group-$(id -g)",
        "5: ENROOT_DATA_PATH /raid/enroot-data",
    ]


@pytest.mark.parametrize("value", ["/run/user/$(id -u)/enroot", "~/.cache/enroot", "${XDG_CACHE_HOME}/enroot",
                                   "/raid/$USER", "/raid/$(whoami)", "/raid/u-${UID}", "/raid/$(id -un)"])
def test_a_path_of_each_users_own_passes(value):
    assert site_slurm.berth_shared_enroot_paths(f"ENROOT_CACHE_PATH {value}\n") == []
