"""roles/spank_plugin: option checks and berth.conf, run through ansible-playbook
(validate.yml and config.yml; the build is library/berth_spank.py's test), and
the written berth.conf read back by a real srun loading the plugin."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent

PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Check the options
      ansible.builtin.include_role:
        name: spank_plugin
        tasks_from: validate.yml
    - name: Write berth.conf
      ansible.builtin.include_role:
        name: spank_plugin
        tasks_from: config.yml
"""


def run_role(tmp_path, cases, check=False, plugin_dir="/usr/lib/slurm", play=PLAY,
             host_vars=None):
    """Run the play once; each case (name -> spank_plugin_options) is a local
    host of its own writing below tmp_path/name. Returns ansible's JSON report."""
    hosts = {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "spank_plugin_options": options, "spank_plugin_dir": plugin_dir,
               "spank_plugin_slurm_config_dir": str(tmp_path / name / "etc"),
               **(host_vars or {})}
        for name, options in cases.items()}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    play_file = tmp_path / "play.yml"
    play_file.write_text(play)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_DEPRECATION_WARNINGS="false",
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="json")
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(play_file)]
    if check:
        cmd += ["--check", "--diff"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return json.loads(result.stdout)


def changed(report, host="case"):
    return report["stats"][host]["changed"]


def failure(report, host):
    """The msg of the task that failed on host."""
    for play in report["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(host, {})
            for res in result.get("results", [result]):
                if res.get("failed"):
                    return res["msg"]
    raise AssertionError(f"no task failed on {host}")


def berth_conf(tmp_path, host="case"):
    return (tmp_path / host / "etc" / "plugstack.conf.d" / "berth.conf").read_text()


@pytest.mark.playbook
def test_writes_berth_conf_with_normalised_options_once(tmp_path):
    options = {"sbatch_support": False, "use_squashfuse": "Y", "execute_entrypoint": 0,
               "container_scope": "job", "importer": "/usr/bin/enroot"}
    report = run_role(tmp_path, {"case": options})
    assert report["stats"]["case"]["failures"] == 0, report
    lines = [line for line in berth_conf(tmp_path).splitlines() if not line.startswith("#")]
    assert lines == [
        "required /usr/lib/slurm/spank_berth.so berth=/usr/local/bin/berth container_scope=job "
        "execute_entrypoint=no importer=/usr/bin/enroot runtime_path=/run/berth "
        "sbatch_support=no use_squashfuse=yes"]
    assert "Ansible" in berth_conf(tmp_path).splitlines()[0]

    report = run_role(tmp_path, {"case": options})
    assert report["stats"]["case"]["failures"] == 0 and changed(report) == 0


@pytest.mark.playbook
def test_check_mode_writes_nothing(tmp_path):
    report = run_role(tmp_path, {"case": {}}, check=True)
    assert report["stats"]["case"]["failures"] == 0 and changed(report) > 0
    assert not (tmp_path / "case").exists()


BAD_OPTIONS = {
    "unknown": ({"runtime_pth": "/run/x"}, "spank_plugin_options: unknown key 'runtime_pth'"),
    "bool": ({"sbatch_support": "maybe"},
             "spank_plugin_options.sbatch_support: 'maybe' is not a boolean"),
    "int": ({"use_enroot_load": 2}, "spank_plugin_options.use_enroot_load: '2' is not a boolean"),
    "relative": ({"runtime_path": "run/berth"},
                 "spank_plugin_options.runtime_path: 'run/berth' is not an absolute path"),
    "space": ({"berth": "/opt/my berth"},
              "spank_plugin_options.berth: '/opt/my berth' is not an absolute path"),
    "scope": ({"container_scope": "node"},
              "spank_plugin_options.container_scope: 'node' is neither job nor global"),
    "timeout0": ({"cleanup_timeout": 0},
                 "spank_plugin_options.cleanup_timeout: '0' is not a number of seconds"),
    "timeout_word": ({"cleanup_timeout": "10m"},
                     "spank_plugin_options.cleanup_timeout: '10m' is not a number of seconds"),
    "timeout_big": ({"cleanup_timeout": 86401},
                    "spank_plugin_options.cleanup_timeout: '86401' is not a number of seconds"),
    "prefix": ({"container_prefix": "site/a"},
               "spank_plugin_options.container_prefix: 'site/a' is not 1 to 32 letters"),
    "prefix_dot": ({"container_prefix": ".a"},
                   "spank_plugin_options.container_prefix: '.a' is not 1 to 32 letters"),
}


def _keys_filter():
    spec = importlib.util.spec_from_file_location(
        "spank_plugstack_keys", REPO / "roles/spank_plugin/filter_plugins/plugstack_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.berth_plugstack_keys


def plugstack_keys():
    """spank/plugstack_keys.h as the role reads it (its filter_plugins)."""
    return _keys_filter()((REPO / "spank/plugstack_keys.h").read_text())


def test_the_role_reads_the_table_the_plugin_is_built_from(tmp_path):
    """The plugstack keys, kinds, defaults and ranges have one table,
    spank/plugstack_keys.h: the role's reading of it is what the C compiler
    makes of it for the plugin's parser."""
    program = tmp_path / "rows.c"
    program.write_text(
        "#include <stdio.h>\n"
        "int main(void)\n{\n"
        "#define PLUGSTACK_KEY(key, kind, def, min, max) "
        "printf(\"%s %s [%s] %ld %ld\\n\", #key, #kind, def, (long)(min), (long)(max));\n"
        '#include "plugstack_keys.h"\n'
        "\treturn 0;\n}\n")
    subprocess.run(["cc", "-Wall", "-Werror", "-I", str(REPO / "spank"), "-o", str(tmp_path / "rows"),
                    str(program)], check=True)
    rows = subprocess.run([tmp_path / "rows"], check=True, capture_output=True, text=True).stdout
    table = plugstack_keys()
    assert rows.splitlines() == [f"{key} {row['kind']} [{row['default']}] {row['min']} {row['max']}"
                                 for key, row in table.items()]
    assert {row["kind"] for row in table.values()} == {"path", "bool", "seconds", "name", "scope"}


def test_the_role_refuses_a_table_line_it_cannot_read():
    """A key the role could not read would go unchecked: the line is named."""
    with pytest.raises(AnsibleFilterError, match=r"cannot read 'PLUGSTACK_KEY\(a, path, x, 0, 0\)'"):
        _keys_filter()('PLUGSTACK_KEY(b, bool, "no", 0, 0)\nPLUGSTACK_KEY(a, path, x, 0, 0)\n')


def test_the_docs_name_the_tables_keys_ranges_and_defaults():
    """meta/argument_specs.yml stays literal YAML (its spank_plugin_options
    is a free dict: the role's own checks name a bad key), so it, the role's
    defaults and task names and spank/README.md are held to the table here."""
    table = plugstack_keys()
    role = REPO / "roles/spank_plugin"
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    spec_text = " ".join(specs["argument_specs"]["main"]["options"]["spank_plugin_options"]["description"])
    defaults_text = (role / "defaults/main.yml").read_text()
    validate_text = (role / "tasks/validate.yml").read_text()
    readme = (REPO / "spank/README.md").read_text()
    section = readme.split("## plugstack.conf", 1)[1].split("\n## ", 1)[0]
    readme_defaults = {name: row.split("|")[2].strip() for row in section.splitlines()
                       if row.startswith("| `") for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert set(readme_defaults) == set(table)
    for key, row in table.items():
        assert re.search(rf"\b{key}\b", spec_text) and re.search(rf"\b{key}\b", defaults_text), key
        assert readme_defaults[key] == (f"`{row['default']}`" if row["default"] else "(berth)"), key
        span = f"{row['min']} to {row['max']}"
        if row["kind"] == "seconds":
            assert f"{row['min']}-{row['max']}" in spec_text and f"{row['min']}-{row['max']}" in defaults_text
            assert f"default {row['default']}" in defaults_text and f"seconds ({span})" in section
            assert f"whole seconds from {span}" in validate_text
        if row["kind"] == "name":
            assert f"default {row['default']}" in spec_text and f"default {row['default']}" in defaults_text
            assert f"{span} letters" in defaults_text.replace("\n# ", " ")
            assert f"{span} letters" in section and f"not {span} letters" in validate_text


def _listed_sources():
    return (REPO / "spank/sources.txt").read_text().split()


def test_one_list_names_the_plugins_sources():
    """spank/sources.txt names every .c and .h of spank/ once, and the
    Makefile builds from exactly those: a file added to the plugin is on the
    list that the role copies to the nodes (next test) and the module builds
    from there."""
    listed = _listed_sources()
    on_disk = {p.name for p in (REPO / "spank").iterdir() if p.suffix in (".c", ".h")}
    assert len(listed) == len(set(listed))
    assert set(listed) == on_disk
    made = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO / "spank"),
         "--eval", "print-%: ; @echo $($*)", "print-PLUGIN_SRC", "print-HEADERS"],
        check=True, capture_output=True, text=True).stdout.split()
    assert sorted(made) == sorted(listed)


BUILD_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Copy the sources and build the plugin
      ansible.builtin.include_role:
        name: spank_plugin
        tasks_from: build.yml
"""


@pytest.mark.playbook
@pytest.mark.skipif(not shutil.which("srun") or not Path("/usr/include/slurm/spank.h").exists(),
                    reason="needs slurm-client and libslurm-dev")
def test_the_role_copies_the_listed_sources_and_builds_once(tmp_path, monkeypatch):
    """The role copies what spank/sources.txt names, the list and the
    Makefile (nothing else) and builds there; a second run and --check
    change nothing."""
    conf = tmp_path / "slurm.conf"  # for `srun -V`, which names the installed Slurm
    conf.write_text("ClusterName=bspk\nSlurmctldHost=localhost\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=p Nodes=localhost Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    build_dir = tmp_path / "case" / "src"
    plugins = tmp_path / "case" / "plugins"
    extra = {"spank_plugin_build_dir": str(build_dir)}

    report = run_role(tmp_path, {"case": {}}, plugin_dir=str(plugins), play=BUILD_PLAY,
                      host_vars=extra)
    assert report["stats"]["case"]["failures"] == 0, report
    copied = {p.name for p in build_dir.iterdir()}
    assert copied == {"Makefile", "sources.txt", *_listed_sources()}
    assert (plugins / "spank_berth.so").exists()

    again = run_role(tmp_path, {"case": {}}, plugin_dir=str(plugins), play=BUILD_PLAY,
                     host_vars=extra)
    assert again["stats"]["case"]["failures"] == 0 and changed(again) == 0, again
    checked = run_role(tmp_path, {"case": {}}, check=True, plugin_dir=str(plugins),
                       play=BUILD_PLAY, host_vars=extra)
    assert checked["stats"]["case"]["failures"] == 0 and changed(checked) == 0, checked


def test_plugin_and_runtime_role_share_the_run_root_and_the_runtime():
    """runtime_path's default (/run/berth) is the root under which the
    container_runtime role puts each user's ENROOT_RUNTIME_PATH
    (<root>/${UID}): the plugin makes <runtime_path>/<uid> for the runtime.
    berth's default is where that role installs the runtime."""
    runtime_defaults = yaml.safe_load((REPO / "roles/container_runtime/defaults/main.yml").read_text())
    runtime_vars = yaml.safe_load((REPO / "roles/container_runtime/vars/main.yml").read_text())
    install = yaml.safe_load((REPO / "roles/container_runtime/tasks/install.yml").read_text())
    table = plugstack_keys()

    run_root = table["runtime_path"]["default"]
    assert run_root == "/run/berth"
    assert runtime_defaults["container_runtime_run_root"] == run_root
    assert (runtime_vars["container_runtime_enroot_conf_base"]["ENROOT_RUNTIME_PATH"]
            == "{{ container_runtime_run_root }}/${UID}")

    berth = table["berth"]["default"]
    assert berth in [task.get("ansible.builtin.file", {}).get("dest") for task in install]


def test_plugin_role_and_runtime_take_the_same_booleans():
    """parse_bool (plugstack.c), the role's check of plugstack booleans and the
    runtime's enroot.conf booleans accept the same words."""
    text = (REPO / "spank/plugstack.c").read_text()
    c_words = {kind: re.findall(r'"([^"]+)"', re.search(
        rf"static const char \*const {kind}\[\] = \{{(.*?)\}};", text).group(1))
        for kind in ("yes", "no")}
    role = yaml.safe_load((REPO / "roles/spank_plugin/vars/main.yml").read_text())
    sys.path.insert(0, str(REPO / "runtime"))
    try:
        from berth import config
    finally:
        sys.path.pop(0)
    assert set(c_words["yes"]) == set(role["spank_plugin_true_words"]) == config._TRUE
    assert set(c_words["no"]) == set(role["spank_plugin_false_words"]) == config._FALSE


@pytest.mark.playbook
def test_cleanup_timeout_reaches_berth_conf(tmp_path):
    report = run_role(tmp_path, {"case": {"cleanup_timeout": 120}})
    assert report["stats"]["case"]["failures"] == 0, report
    assert " cleanup_timeout=120" in berth_conf(tmp_path)


@pytest.mark.playbook
def test_container_prefix_reaches_berth_conf(tmp_path):
    report = run_role(tmp_path, {"case": {"container_prefix": "site_a"}})
    assert report["stats"]["case"]["failures"] == 0, report
    assert " container_prefix=site_a" in berth_conf(tmp_path)


@pytest.mark.playbook
def test_bad_options_fail_naming_the_key_and_change_nothing(tmp_path):
    report = run_role(tmp_path, {name: options for name, (options, _) in BAD_OPTIONS.items()})
    for name, (_, message) in BAD_OPTIONS.items():
        assert message in failure(report, name), name
        assert not (tmp_path / name).exists(), name


@pytest.mark.playbook
@pytest.mark.skipif(not shutil.which("srun") or not Path("/usr/include/slurm/spank.h").exists(),
                    reason="needs slurm-client and libslurm-dev")
def test_srun_loads_the_plugin_with_the_written_options(tmp_path):
    build = tmp_path / "build"
    subprocess.run(["make", "-s", "-C", str(REPO / "spank"), f"O={build}"], check=True)
    report = run_role(tmp_path, {"case": {"sbatch_support": "no", "container_scope": "job"}},
                      plugin_dir=str(build))
    assert report["stats"]["case"]["failures"] == 0
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=bspk\nSlurmctldHost=localhost\n"
        f"PlugStackConfig={tmp_path / 'case' / 'etc' / 'plugstack.conf.d' / 'berth.conf'}\n"
        "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    srun = subprocess.run(["srun", "--container-mounts=/data:", "true"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert "--container-mounts: missing destination in '/data:'" in srun.stderr
    sbatch = subprocess.run(["sbatch", "--container-image=x", "--wrap=true"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert "unrecognized option" in sbatch.stderr  # sbatch_support=no reached the plugin


def test_a_new_plugin_or_berth_conf_restarts_no_daemon():
    """Slurm loads the plugin and berth.conf afresh for every command, step and
    epilog (roles/spank_plugin/handlers/main.yml): nothing may restart slurmd
    or slurmctld under running jobs for them."""
    role = REPO / "roles" / "spank_plugin"
    assert yaml.safe_load((role / "handlers" / "main.yml").read_text()) == []
    for tasks in (role / "tasks").glob("*.yml"):
        for task in yaml.safe_load(tasks.read_text()) or []:
            assert "notify" not in task, f"{tasks.name}: {task.get('name')}"
