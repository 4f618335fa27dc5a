"""roles/adopt on a pretend node of a site that runs pyxis and enroot on its
own Slurm: the preflight's plan and refusals, the way there with the
container_runtime and spank_plugin tasks that write the node's files
(hooks, enroot.conf, the enroot link, the prolog, berth.conf), a second run
changing nothing, check mode changing nothing, and the way back leaving
every file byte for byte as the site had it. Run through ansible-playbook
on localhost with every path below tmp_path.

scontrol is a stand-in that prints `show config` as Slurm 22.05 does, or
as 24.11 does with FAKE_SLURM=24.11 (each Prolog line numbered, as
measured on Debian 13's 24.11.5); no slurmctld here. molecule/adopt runs
the real one."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

SCONTROL = """#!/bin/sh
[ "$1 $2" = "show config" ] || exit 1
cat <<END
Configuration data as of 2026-01-01T00:00:00
AccountingStorageType   = accounting_storage/slurmdbd
Epilog                  = {root}/etc/slurm/site-epilog.sh
PlugStackConfig         = ${{FAKE_PLUGSTACK:-{root}/etc/slurm/plugstack.conf}}
END
if [ "$FAKE_SLURM" = 24.11 ]; then  # FAKE_PROLOG: the Prolog lines, split by ';'
    set -f
    n=0
    for prolog in $(echo "$FAKE_PROLOG" | tr ';' ' '); do
        echo "Prolog[$n]               = $prolog"
        n=$((n + 1))
    done
    echo "SLURM_VERSION           = 24.11.5"
else
    echo "Prolog                  = $FAKE_PROLOG"
    echo "SLURM_VERSION           = 22.05.8"
fi
cat <<END

Cgroup Support Configuration:
CgroupPlugin            = autodetect
END
"""

DEPLOY = [{"hosts": "localhost", "gather_facts": False, "tasks": [
    {"name": "Set pyxis and enroot aside", "ansible.builtin.include_role": {"name": "adopt"}},
    # container_runtime's install.yml builds the venv (too slow here); its
    # last task, the link that puts berth on the PATH, as it writes it
    {"name": "berth on the PATH", "ansible.builtin.file": {
        "src": "{{ container_runtime_venv }}/bin/berth", "dest": "{{ adopt_berth_link }}",
        "state": "link", "force": True}},
] + [{"name": f"container_runtime {part}",
      "ansible.builtin.include_role": {"name": "container_runtime", "tasks_from": part}}
     for part in ("hooks.yml", "enroot_conf.yml", "enroot_link.yml", "prolog.yml")] + [
    {"name": "berth.conf", "ansible.builtin.include_role": {"name": "spank_plugin", "tasks_from": "config.yml"}},
]}]

ROLLBACK = [{"hosts": "localhost", "gather_facts": False, "tasks": [
    {"name": "The way back", "ansible.builtin.include_role": {"name": "adopt", "tasks_from": "rollback.yml"}}]}]

SITE_ENROOT_CONF = """# the site's enroot.conf, as its admin wrote it
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
#ENROOT_DATA_PATH ${XDG_DATA_HOME}/enroot
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
ENROOT_MOUNT_HOME yes
"""


@pytest.fixture
def node(tmp_path):
    """The site's node: pyxis beside another SPANK plugin, enroot's commands
    and hooks beside the site's own, a site enroot.conf."""
    root = tmp_path / "node"
    files = {
        "etc/slurm/plugstack.conf": f"include {root}/etc/slurm/plugstack.conf.d/*.conf\n",
        "etc/slurm/plugstack.conf.d/pyxis.conf": "required /usr/local/lib/slurm/spank_pyxis.so\n",
        "etc/slurm/plugstack.conf.d/site.conf": "optional /usr/local/lib/slurm/site_mark.so\n",
        "etc/slurm/prolog.d/10-site-mark.sh": "#!/bin/sh\ntouch /tmp/site-prolog\n",
        "etc/enroot/enroot.conf": SITE_ENROOT_CONF,
        "etc/enroot/hooks.d/10-cgroups.sh": "#!/bin/bash\n# enroot's\n",
        "etc/enroot/hooks.d/10-shadow.sh": "#!/bin/bash\n# enroot's shadow\n",
        "etc/enroot/hooks.d/98-nvidia.sh": "#!/bin/bash\n# enroot's nvidia\n",
        "etc/enroot/hooks.d/50-slurm-pmi.sh": "#!/bin/bash\n# enroot's extra\n",
        "etc/enroot/hooks.d/60-site.sh": "#!/bin/bash\n# the site's own\n",
        "etc/enroot/environ.d/50-site.env": "SITE=1\n",
        "usr/local/bin/enroot": "#!/bin/bash\necho real enroot\n",
        "usr/local/bin/enroot-nsenter": "\x7fELF enroot's\n",
        "opt/berth/bin/berth": "#!/bin/sh\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        (root / rel).chmod(0o755 if rel.endswith((".sh", "enroot", "berth", "nsenter")) else 0o644)
    (root / "usr/bin").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL.format(root=root))
    (bin_dir / "scontrol").chmod(0o755)
    return root


def node_vars(root):
    return {
        "ansible_python_interpreter": sys.executable,
        "adopt_manifest": f"{root}/var/lib/berth/adopt/manifest.json",
        "adopt_enroot": True,  # a compute node
        "adopt_slurm_config_dir": f"{root}/etc/slurm",
        "adopt_enroot_sysconf_dir": f"{root}/etc/enroot",
        "adopt_prolog_dir": f"{root}/etc/slurm/prolog.d",
        "adopt_enroot_commands": [f"{root}/usr/bin/enroot", f"{root}/usr/local/bin/enroot",
                                  f"{root}/usr/local/bin/enroot-nsenter"],
        "adopt_enroot_link": f"{root}/usr/local/bin/enroot",
        "adopt_berth_link": f"{root}/usr/local/bin/berth",
        "adopt_berth_command": f"{root}/opt/berth/bin/berth",
        "container_runtime_venv": f"{root}/opt/berth",
        "container_runtime_sysconf_dir": f"{root}/etc/enroot",
        "container_runtime_enroot_link_path": f"{root}/usr/local/bin/enroot",
        "container_runtime_enroot_paths": [f"{root}/usr/bin/enroot", f"{root}/usr/local/bin/enroot"],
        "container_runtime_prolog_dir": f"{root}/etc/slurm/prolog.d",
        "container_runtime_storage_root": "/var/lib/berth",
        "spank_plugin_slurm_config_dir": f"{root}/etc/slurm",
        "spank_plugin_dir": "/usr/lib/slurm",
    }


def play(root, playbook, check=False, prolog=None, plugstack=None, slurm="22.05", **more):
    """ansible-playbook of `playbook` on a node of Slurm `slurm` (22.05 or
    24.11): (exit status, changed count, output)."""
    tmp = root.parent
    (tmp / "play.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    (tmp / "vars.json").write_text(json.dumps({**node_vars(root), **more}))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
           "-e", f"@{tmp / 'vars.json'}", str(tmp / "play.yml")] + (["--check", "--diff"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_DEPRECATION_WARNINGS="false", ANSIBLE_LOCALHOST_WARNING="false",
               PATH=f"{tmp / 'bin'}:{os.environ['PATH']}",
               FAKE_PROLOG=prolog or f"{root}/etc/slurm/prolog.d/*", FAKE_SLURM=slurm,
               **({"FAKE_PLUGSTACK": plugstack} if plugstack else {}))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", done.stdout)
    return done.returncode, int(recap.group(1)) if recap else None, done.stdout + done.stderr


def tree(root):
    """Every file and link below the node's etc/ and usr/: bytes, mode, link target."""
    found = {}
    for top in ("etc", "usr"):
        for path in sorted((root / top).rglob("*")):
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = (path.read_bytes(), path.stat().st_mode & 0o7777)
    return found


def test_check_mode_says_what_it_will_do_with_each_file_and_changes_nothing(node):
    before = tree(node)
    status, _, out = play(node, DEPLOY, check=True)
    assert status == 0, out
    for line in (f"{node}/etc/slurm/plugstack.conf.d/pyxis.conf: pyxis line, moved aside",
                 f"{node}/etc/enroot/hooks.d/98-nvidia.sh: enroot hook, moved aside; Berth has 90-nvidia.sh",
                 f"{node}/etc/enroot/hooks.d/50-slurm-pmi.sh: enroot hook, moved aside; Berth has the SPANK plugin",
                 f"{node}/etc/enroot/hooks.d/60-site.sh: stays, and runs under Berth",
                 f"{node}/etc/enroot/hooks.d/10-cgroups.sh: stays, and runs under Berth",
                 f"{node}/usr/local/bin/enroot: enroot command, moved aside",
                 "enroot.conf: kept as the site wrote it; Berth adds only keys it lacks",
                 "Slurm 22.05.8: slurm.conf, gres.conf, cgroup.conf, the prologs and epilogs stay"):
        assert line in out, line
    assert tree(node) == before
    assert not (node / "var").exists()


def test_there_keeping_the_sites_files_and_back_byte_for_byte(node):
    before = tree(node)
    status, _, out = play(node, DEPLOY)
    assert status == 0, out
    slurm, enroot = node / "etc/slurm", node / "etc/enroot"
    assert not (slurm / "plugstack.conf.d/pyxis.conf").exists()
    assert (slurm / "plugstack.conf.d/site.conf").exists()
    assert "spank_berth.so" in (slurm / "plugstack.conf.d/berth.conf").read_text()
    # its include glob already covers berth.conf: not a byte changed
    assert (slurm / "plugstack.conf").read_text() == f"include {node}/etc/slurm/plugstack.conf.d/*.conf\n"
    assert (slurm / "prolog.d/10-site-mark.sh").exists() and (slurm / "prolog.d/50-berth-user-dirs.sh").exists()
    conf = (enroot / "enroot.conf").read_text()
    assert conf.startswith(SITE_ENROOT_CONF)
    added = conf[len(SITE_ENROOT_CONF):]
    assert "ENROOT_TRANSFER_RETRIES 5" in added and "ENROOT_ALLOW_HTTP no" in added
    for key in ("ENROOT_RUNTIME_PATH", "ENROOT_SQUASH_OPTIONS", "ENROOT_DATA_PATH", "ENROOT_CACHE_PATH"):
        assert key not in added, key  # the site's, or enroot's default where it has none
    hooks = {p.name for p in (enroot / "hooks.d").iterdir()}
    assert {"90-nvidia.sh", "10-shadow.sh", "10-cgroups.sh", "60-site.sh"} <= hooks
    assert not {"98-nvidia.sh", "50-slurm-pmi.sh"} & hooks
    assert (enroot / "hooks.d/10-shadow.sh").read_bytes() == (REPO / "hooks/10-shadow.sh").read_bytes()
    assert (enroot / "environ.d/50-site.env").read_text() == "SITE=1\n"
    assert os.readlink(node / "usr/local/bin/enroot") == f"{node}/opt/berth/bin/berth"
    assert not (node / "usr/local/bin/enroot-nsenter").exists()
    status, changed, out = play(node, DEPLOY)
    assert status == 0 and changed == 0, out
    status, _, out = play(node, ROLLBACK)
    assert status == 0, out
    assert tree(node) == before
    status, changed, out = play(node, ROLLBACK)
    assert status == 0 and changed == 0, out


def test_a_pyxis_line_in_plugstack_conf_itself_is_commented_out_and_back(node):
    plugstack = node / "etc/slurm/plugstack.conf"
    (node / "etc/slurm/plugstack.conf.d/pyxis.conf").unlink()
    plugstack.write_text("required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis\n"
                         f"include {node}/etc/slurm/plugstack.conf.d/*.conf\n")
    before = tree(node)
    status, _, out = play(node, DEPLOY)
    assert status == 0, out
    text = plugstack.read_text()
    assert not re.search(r"(?m)^required .*spank_pyxis", text)
    assert "# pyxis, switched off by Berth" in text
    assert play(node, DEPLOY)[1] == 0
    assert play(node, ROLLBACK)[0] == 0
    assert tree(node) == before


def test_a_plugstack_conf_without_an_include_gets_one_line(node):
    """scontrol shows PlugStackConfig = (null) where slurm.conf leaves it
    out (22.05, measured): Slurm's default, plugstack.conf beside slurm.conf."""
    plugstack = node / "etc/slurm/plugstack.conf"
    plugstack.write_text("optional /usr/local/lib/slurm/site_mark.so\n")
    status, _, out = play(node, DEPLOY, plugstack="(null)")
    assert status == 0, out
    assert plugstack.read_text() == ("optional /usr/local/lib/slurm/site_mark.so\n"
                                     f"include {node}/etc/slurm/plugstack.conf.d/berth.conf\n")


# Slurm 22.05 takes no comma list: `A,B` is one pattern, and fails every prolog
@pytest.mark.parametrize("prolog", ["/etc/slurm/site-prolog.sh", "(null)",
                                    "/etc/slurm/site-prolog.sh,{node}/etc/slurm/prolog.d/*"])
def test_a_prolog_that_would_not_run_berths_stops_before_any_change(node, prolog):
    prolog = prolog.format(node=node)
    before = tree(node)
    status, _, out = play(node, DEPLOY, prolog=prolog)
    assert status != 0
    assert f"slurm.conf: Prolog={prolog} does not run {node}/etc/slurm/prolog.d/50-berth-user-dirs.sh" in out
    assert "Make Prolog a glob that matches it" in out
    assert tree(node) == before and not (node / "var").exists()


# Slurm 24.11 runs every Prolog line in turn: the site's prolog keeps a line of its own
def test_on_slurm_24_11_a_prolog_line_of_berths_own_passes(node):
    status, _, out = play(node, DEPLOY, check=True, slurm="24.11",
                          prolog=f"/etc/slurm/site-prolog.sh;{node}/etc/slurm/prolog.d/*")
    assert status == 0, out
    assert f"(Prolog /etc/slurm/site-prolog.sh, {node}/etc/slurm/prolog.d/* runs" in out


def test_on_slurm_24_11_the_refusal_asks_for_a_line_of_its_own(node):
    before = tree(node)
    status, _, out = play(node, DEPLOY, slurm="24.11", prolog="/etc/slurm/site-prolog.sh")
    assert status != 0
    assert (f"slurm.conf: Prolog=/etc/slurm/site-prolog.sh does not run "
            f"{node}/etc/slurm/prolog.d/50-berth-user-dirs.sh") in out
    assert f"Add a line Prolog={node}/etc/slurm/prolog.d/*" in out
    assert tree(node) == before and not (node / "var").exists()


def test_the_admins_word_that_the_sites_prolog_runs_the_directory(node):
    status, _, out = play(node, DEPLOY, check=True, prolog="/etc/slurm/site-prolog.sh",
                          adopt_site_prolog_runs_prolog_dir=True)
    assert status == 0, out


def test_a_glob_over_berths_directory_passes(node):
    status, _, out = play(node, DEPLOY, check=True, prolog=f"{node}/etc/slurm/prolog.d/[0-9]*.sh")
    assert status == 0, out


def test_a_groups_shared_cache_in_the_sites_enroot_conf_stops_before_any_change(node):
    """pyxis's setup guide's per-group cache, kept as the site wrote it,
    would be refused to every member but its owner at each start."""
    conf = node / "etc/enroot/enroot.conf"
    conf.write_text(SITE_ENROOT_CONF + "ENROOT_CACHE_PATH /raid/enroot-cache/group-$(id -g)\n")
    before = tree(node)
    status, _, out = play(node, DEPLOY)
    assert status != 0
    line = len(SITE_ENROOT_CONF.splitlines()) + 1
    assert (f"{conf}:{line}: ENROOT_CACHE_PATH /raid/enroot-cache/group-$(id -g): a directory shared "
            "between users") in out
    assert tree(node) == before and not (node / "var").exists()


CONTROLLER = [{"hosts": "localhost", "gather_facts": False, "tasks": [
    {"name": "Set pyxis aside", "ansible.builtin.include_role": {"name": "adopt"}},
    {"name": "berth.conf", "ansible.builtin.include_role": {"name": "spank_plugin", "tasks_from": "config.yml"}},
]}]


def test_a_host_without_berths_runtime_keeps_enroot_and_loses_only_pyxis(node):
    """A controller that runs no containers gets the plugin (srun's flags) but
    not the runtime: its enroot stays, and so do its hooks."""
    before = tree(node)
    status, _, out = play(node, CONTROLLER, adopt_enroot=False)
    assert status == 0, out
    assert not (node / "etc/slurm/plugstack.conf.d/pyxis.conf").exists()
    assert (node / "usr/local/bin/enroot").read_text() == "#!/bin/bash\necho real enroot\n"
    assert (node / "etc/enroot/hooks.d/98-nvidia.sh").exists()
    assert "enroot command, moved aside" not in out and "enroot hook, moved aside" not in out
    assert play(node, ROLLBACK)[0] == 0
    assert tree(node) == before
