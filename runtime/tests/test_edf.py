"""Environment Definition Files: lookup, inheritance, expansion, validation, output."""

import json
import re
import tomllib
from pathlib import Path

import pytest

from berth import cli
from berth.errors import BerthError
from berth.site import annotations, edf


@pytest.fixture
def site(tmp_path):
    """An EDF directory, an empty HOME and a hooks.d with pmix and nvidia hooks."""
    edf_dir = tmp_path / "edf"
    edf_dir.mkdir()
    hooks = tmp_path / "sysconf" / "hooks.d"
    hooks.mkdir(parents=True)
    for hook in ("50-pmix.sh", "90-nvidia.sh", "91-ofi_nccl.sh"):
        (hooks / hook).write_text("#!/bin/sh\n")
    # Files beside the hooks that the runtime does not run are not hooks.
    (hooks / "common.bash").write_text("")
    (hooks / "nvidia-libraries.conf").write_text("")
    (tmp_path / "home").mkdir()
    return tmp_path


def write(directory, name, text):
    path = directory / name
    path.write_text(text)
    return path


def environ(site, **extra):
    return {"EDF_PATH": str(site / "edf"), "HOME": str(site / "home"), **extra}


def resolve(site, ref, **extra):
    return edf.resolve(ref, environ(site, **extra), hooks_dir=site / "sysconf" / "hooks.d")


def failure(site, ref, **extra):
    with pytest.raises(BerthError) as caught:
        resolve(site, ref, **extra)
    return str(caught.value)


# ---------------------------------------------------------------- inheritance


def test_three_levels_merge_child_over_parent(site):
    d = site / "edf"
    root = write(d, "root.toml", """
image = "root-image"
workdir = "/root-wd"
writable = false
mounts = ["/a:/data", "/a/sub:/data/sub", "/tools:/tools:ro"]
[env]
LEVEL = "root"
ROOT_ONLY = "r"
[annotations]
com.hooks.pmix.enable = true
""")
    middle = write(d, "middle.toml", """
base_environment = "root"
workdir = "/middle-wd"
mounts = ["/b:/data/"]
[env]
LEVEL = "middle"
[annotations]
com.hooks.pmix.enable = false
com.hooks.nvidia.enable = true
""")
    leaf = write(d, "leaf.toml", """
base_environment = ["middle"]
image = "leaf-image"
entrypoint = true
mounts = ["/c:/extra"]
[env]
LEVEL = "leaf"
""")
    got = resolve(site, "leaf")
    assert got["image"] == "leaf-image"
    assert got["workdir"] == "/middle-wd"
    assert got["writable"] is False
    assert got["entrypoint"] is True
    # /data replaced in place (nested /data/sub stays after it), /extra appended
    assert got["mounts"] == ["/b:/data/", "/a/sub:/data/sub", "/tools:/tools:ro", "/c:/extra"]
    assert got["env"] == {"LEVEL": "leaf", "ROOT_ONLY": "r"}
    assert got["annotations"] == {"com.hooks.pmix.enable": False, "com.hooks.nvidia.enable": True}
    assert got["sources"] == {
        "image": str(leaf), "workdir": str(middle), "writable": str(root),
        "entrypoint": str(leaf),
        "mounts./data": str(middle), "mounts./data/sub": str(root),
        "mounts./tools": str(root), "mounts./extra": str(leaf),
        "env.LEVEL": str(leaf), "env.ROOT_ONLY": str(root),
        "annotations.com.hooks.pmix.enable": str(middle),
        "annotations.com.hooks.nvidia.enable": str(middle),
    }
    assert got["hook_env"] == {"BERTH_HOOK_PMIX_ENABLE": "0", "BERTH_HOOK_NVIDIA_ENABLE": "1"}


def test_parents_apply_in_listed_order_and_a_diamond_is_no_cycle(site):
    d = site / "edf"
    write(d, "common.toml", 'image = "common"\n[env]\nX = "common"\n')
    write(d, "a.toml", 'base_environment = "common"\n[env]\nX = "a"\nA = "1"\n')
    write(d, "b.toml", 'base_environment = "common"\n[env]\nX = "b"\n')
    write(d, "child.toml", 'base_environment = ["a", "b"]\n')
    got = resolve(site, "child")
    assert got["env"] == {"X": "b", "A": "1"}
    assert got["image"] == "common"


def test_unset_values_are_null(site):
    write(site / "edf", "bare.toml", "")
    got = resolve(site, "bare")
    assert [got[k] for k in ("image", "workdir", "entrypoint", "writable")] == [None] * 4
    assert (got["mounts"], got["env"], got["annotations"]) == ([], {}, {})


# ---------------------------------------------------------------- lookup


def test_edf_path_order_then_home(site):
    first, second = site / "first", site / "second"
    first.mkdir()
    second.mkdir()
    write(second, "env.toml", 'image = "second"\n')
    write(first, "env", 'image = "first-without-suffix"\n')
    (site / "home" / ".edf").mkdir()
    write(site / "home" / ".edf", "mine.toml", 'image = "home"\n')
    path = f"{first}:{second}"
    assert resolve(site, "env", EDF_PATH=path)["image"] == "first-without-suffix"
    (first / "env").unlink()
    assert resolve(site, "env", EDF_PATH=path)["image"] == "second"
    assert resolve(site, "mine", EDF_PATH=path)["image"] == "home"


def test_edf_path_relative_entry_refused(site):
    (site / "edf").mkdir(exist_ok=True)
    write(site / "edf", "env.toml", 'image = "x"\n')
    with pytest.raises(BerthError, match=r"^EDF_PATH: 'edf' is not an absolute path$"):
        resolve(site, "env", EDF_PATH=f"{site / 'edf'}:edf")


def test_paths_and_relative_parents(site, monkeypatch):
    other = site / "other"
    other.mkdir()
    write(other, "parent.toml", 'image = "by-relative-path"\n')
    write(other, "child", 'base_environment = "./parent.toml"\n')
    monkeypatch.chdir(site)
    assert resolve(site, "other/child")["image"] == "by-relative-path"
    assert resolve(site, str(other / "parent.toml"))["image"] == "by-relative-path"


# ---------------------------------------------------------------- ${VAR}


def test_variables_expand_from_the_submitting_environment(site):
    write(site / "edf", "v.toml", """
image = "${REG}#img:${TAG}"
workdir = "${SCRATCH}/wd"
mounts = ["${SCRATCH}/data:/data"]
[env]
WHERE = "${SCRATCH}"
[annotations]
note = "${NOT_EXPANDED}"
""")
    got = resolve(site, "v", REG="reg.example", TAG="1.0", SCRATCH="/scratch/u")
    assert got["image"] == "reg.example#img:1.0"
    assert got["workdir"] == "/scratch/u/wd"
    assert got["mounts"] == ["/scratch/u/data:/data"]
    assert got["env"] == {"WHERE": "/scratch/u"}
    assert got["annotations"] == {"note": "${NOT_EXPANDED}"}


def test_default_words_and_escaped_dollars(site):
    write(site / "edf", "d.toml", """
workdir = "${WD:-/fallback}"
mounts = ["/data${SUFFIX:-}:/data", "${EMPTY:-/e}:/e"]
[env]
PRICE = "$$5 and $${HOME}"
SET = "${REG:-unused}"
""")
    got = resolve(site, "d", REG="reg.example", EMPTY="")
    assert got["workdir"] == "/fallback"
    assert got["mounts"] == ["/data:/data", "/e:/e"]
    assert got["env"] == {"PRICE": "$5 and ${HOME}", "SET": "reg.example"}


def test_unset_variable_names_var_and_file(site):
    path = write(site / "edf", "v.toml", '\nmounts = ["${SCRATCH}/data:/data"]\n')
    assert failure(site, "v") == f"{path}:2: ${{SCRATCH}} in 'mounts' is not set in the environment"


# ---------------------------------------------------------------- hooks


def test_hook_environment_mapping():
    resolved = {"annotations": {
        "com.hooks.ofi-nccl.enable": True, "com.hooks.ofi-nccl.version": "cuda12",
        "com.hooks.pmix.enable": False, "com.hooks.pmix.max.ranks": 8,
        "org.example.other": "ignored"}}
    assert edf.hook_environment(resolved).env == {
        "BERTH_HOOK_OFI_NCCL_ENABLE": "1", "BERTH_HOOK_OFI_NCCL_VERSION": "cuda12",
        "BERTH_HOOK_PMIX_ENABLE": "0", "BERTH_HOOK_PMIX_MAX_RANKS": "8"}


def test_the_cscs_engines_enabled_strings_switch_a_hook_as_enable_does():
    resolved = {"annotations": {
        "com.hooks.nvidia.enabled": "false", "com.hooks.pmix.enabled": "true",
        "com.hooks.ofi-nccl.enabled": True, "com.hooks.ofi-nccl.enable": True,
        "com.hooks.ofi-nccl.variant": "cuda12"}}
    assert edf.hook_environment(resolved).env == {
        "BERTH_HOOK_NVIDIA_ENABLE": "0", "BERTH_HOOK_PMIX_ENABLE": "1",
        "BERTH_HOOK_OFI_NCCL_ENABLE": "1", "BERTH_HOOK_OFI_NCCL_VARIANT": "cuda12"}


def test_an_annotation_for_a_hook_not_installed_is_a_warning_and_left_out(site, run):
    """A portable EDF: on a cluster without the hook the job goes on."""
    path = write(site / "edf", "h.toml", 'image = "x"\n[annotations]\n'
                 '"com.hooks.cxi.enable" = true\ncom.hooks.pmix.enable = true\n')
    warning = (f"{path}: annotation 'com.hooks.cxi.enable' is for hook 'cxi', which is not "
               f"installed in {site / 'sysconf' / 'hooks.d'} (installed: nvidia, ofi_nccl, "
               f"pmix): left out")
    got = resolve(site, "h")
    assert got["warnings"] == [warning]
    assert got["hook_env"] == {"BERTH_HOOK_PMIX_ENABLE": "1"}
    assert run("edf", "check", "h") == (0, "", f"berth: warning: {warning}\n")
    status, out, err = run("edf", "show", "--spank", "h")
    assert (status, err) == (0, "")
    assert out.splitlines() == [f"warning={warning}", "image=x",
                                "hook_env=BERTH_HOOK_PMIX_ENABLE=1"]


@pytest.mark.parametrize("annotations, expected", [
    ('com.hooks.pmix.enable = "yes"', "annotation 'com.hooks.pmix.enable' must be true or false"),
    ('com.hooks.pmix.enabled = "True"',
     "annotation 'com.hooks.pmix.enabled' must be true or false"),
    ('com.hooks.pmix.enabled = 1', "annotation 'com.hooks.pmix.enabled' must be true or false"),
    ('com.hooks.pmix.enable = true\ncom.hooks.pmix.enabled = "false"',
     "annotations 'com.hooks.pmix.enable' and 'com.hooks.pmix.enabled' disagree"),
    ('"com.hooks.pmix" = true', "annotation 'com.hooks.pmix' is not com.hooks.NAME.PARAM"),
])
def test_bad_hook_annotations(site, annotations, expected):
    path = write(site / "edf", "h.toml", f"[annotations]\n{annotations}\n")
    assert failure(site, "h") == f"{path}: {expected}"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("text, expected", [
    ('image = "x"\nbogus = 1\n', "2: unknown key 'bogus' (known: annotations, base_environment, "
     "containerfile, devices, entrypoint, env, image, mounts, workdir, writable)"),
    ('devices = "vendor.example/nic=0"\n', "1: 'devices' must be an array of CDI device names"),
    ('devices = ["nic0"]\n', "1: device 'nic0' is not a CDI device name (VENDOR/CLASS=DEVICE, "
     "as nvidia.com/gpu=0)"),
    ('containerfile = 3\n', "1: 'containerfile' must be a string, not an integer"),
    ('containerfile = ""\n', "1: 'containerfile' is empty"),
    ('entrypoint = "no"\n', "1: 'entrypoint' must be a boolean, not a string"),
    ('\nwritable = 1\n', "2: 'writable' must be a boolean, not an integer"),
    ('image = 3\n', "1: 'image' must be a string, not an integer"),
    ('image = ""\n', "1: 'image' is empty"),
    ('workdir = "relative"\n', "1: 'workdir' must be an absolute path, not 'relative'"),
    ('mounts = "/a:/b"\n', "1: 'mounts' must be an array of strings, not a string"),
    ('mounts = [1]\n', "1: 'mounts' entries must be strings, not an integer"),
    ('mounts = ["/data"]\n', "1: mount '/data' has no destination (SRC:DST[:FLAGS])"),
    ('mounts = ["/data:"]\n', "1: mount '/data:' has no destination (SRC:DST[:FLAGS])"),
    ('mounts = ["/data:rel"]\n', "1: mount '/data:rel': destination 'rel' is not an absolute path"),
    ('mounts = [":/dst"]\n', "1: mount ':/dst' is not SRC:DST[:FLAGS]"),
    ('mounts = ["/a:/b:ro:x"]\n', "1: mount '/a:/b:ro:x' is not SRC:DST[:FLAGS]"),
    ('mounts = ["/a:/b:ro+bogus"]\n', "1: mount '/a:/b:ro+bogus': unknown mount flag 'bogus'"),
    ('env = "X=1"\n', "1: 'env' must be a table, not a string"),
    ('[env]\nOK = "1"\nN = 3\n', "3: 'env.N' must be a string, not an integer"),
    ('env.N = true\n', "1: 'env.N' must be a string, not a boolean"),
    ('[annotations]\nratio = 0.5\n', "2: 'annotations.ratio' must be a string, integer or "
     "boolean, not a float"),
    ('base_environment = 3\n', "1: 'base_environment' must be a name or an array of names"),
    ('base_environment = [""]\n', "1: 'base_environment' must be a name or an array of names"),
])
def test_bad_values_name_file_line_and_key(site, text, expected):
    path = write(site / "edf", "bad.toml", text)
    assert failure(site, "bad") == f"{path}:{expected}"


def test_toml_syntax_error_gives_file_and_line(site):
    path = write(site / "edf", "syntax.toml", 'image = "x"\nworkdir = /nope\n')
    message = failure(site, "syntax")
    assert message.startswith(f"{path}:2: invalid TOML: ")
    assert "at line" not in message


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "{a = " * 5000 + "1" + "}" * 5000],
                         ids=["arrays", "inline-tables"])
def test_toml_nested_thousands_deep_is_bad_toml_not_a_traceback(site, value):
    path = write(site / "edf", "deep.toml", f'image = "x"\nenv = {value}\n')
    assert failure(site, "deep") == \
        f"{path}: invalid TOML: arrays or inline tables nested too deeply"


# Before parsing: a key of 100,000 parts (tomllib's time grows with the
# square of a key's parts: minutes), an integer past int()'s 4,300 digits (a
# ValueError traceback).
@pytest.mark.parametrize("text, why", [
    ('image = "x"\n' + ".".join(["a"] * 100_000) + ' = "y"\n',
     ":2: invalid TOML: a key of more than 100 dotted parts"),
    ('image = "x"\nworkdir = ' + "9" * 5000 + "\n",
     ": invalid TOML: an integer of more than 4300 digits"),
], ids=["100000-part-key", "5000-digit-integer"])
def test_toml_too_costly_to_read_is_refused_in_one_line(site, text, why):
    path = write(site / "edf", "costly.toml", text)
    assert failure(site, "costly") == f"{path}{why}"


def test_missing_environment_says_where_it_looked(site):
    message = failure(site, "nothere")
    assert message == (f"environment 'nothere' not found as nothere or nothere.toml in: "
                       f"{site / 'edf'}, {site / 'home' / '.edf'}")
    assert failure(site, "/no/such.toml") == "/no/such.toml: no such environment file"


def test_missing_parent_names_the_child(site):
    path = write(site / "edf", "orphan.toml", '\nbase_environment = "ghost"\n')
    assert failure(site, "orphan").startswith(
        f"{path}:2: base_environment: environment 'ghost' not found as ghost or ghost.toml in: ")


def test_cycles_are_named(site):
    d = site / "edf"
    write(d, "a.toml", 'base_environment = "b"\n')
    write(d, "b.toml", 'base_environment = ["c", "a"]\n')
    write(d, "c.toml", "")
    write(d, "self.toml", 'base_environment = "self.toml"\n')
    assert failure(site, "a") == "base_environment cycle: a -> b -> a"
    assert failure(site, "self") == "base_environment cycle: self -> self.toml"


# ---------------------------------------------------------------- command line


@pytest.fixture
def run(site, monkeypatch, capsys):
    """Run `berth ...` in-process with the site's EDF_PATH and hooks."""
    for key, value in environ(site, SCRATCH="/scratch/u").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ENROOT_SYSCONF_PATH", str(site / "sysconf"))

    def run_cli(*argv):
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err
    return run_cli


PYTORCH = """
base_environment = "site"
image = "nvcr.io#nvidia/pytorch:24.01-py3"
entrypoint = false
[env]
"ODD KEY" = "tab\\tquote\\"back\\\\slash\\u007f"
[annotations]
com.hooks.ofi_nccl.version = "cuda12"
"""
SITE = """
workdir = "/workspace"
writable = true
mounts = ["${SCRATCH}:/scratch", "/home:/home:ro"]
devices = ["vendor.example/nic=nic0"]
[env]
NCCL_DEBUG = "WARN"
[annotations]
com.hooks.pmix.enable = true
com.hooks.ofi_nccl.enable = true
count = 2
"""


def test_show_toml_round_trips_with_sources(site, run):
    write(site / "edf", "site.toml", SITE)
    child = write(site / "edf", "pytorch.toml", PYTORCH)
    status, out, err = run("edf", "show", "pytorch")
    assert (status, err) == (0, "")
    parsed = tomllib.loads(out)
    resolved = edf.resolve("pytorch", environ(site, SCRATCH="/scratch/u"))
    assert parsed == {k: v for k, v in resolved.items()
                      if k not in ("sources", "hook_env", "warnings") and v is not None}
    assert f'image = "nvcr.io#nvidia/pytorch:24.01-py3"  # {child}\n' in out
    assert f'    "/scratch/u:/scratch",  # {site / "edf" / "site.toml"}\n' in out


def test_show_json_is_the_plugin_interface(site, run):
    write(site / "edf", "site.toml", SITE)
    write(site / "edf", "pytorch.toml", PYTORCH)
    status, out, _ = run("edf", "show", "--json", "pytorch")
    data = json.loads(out)
    assert status == 0
    assert list(data) == ["image", "workdir", "entrypoint", "writable", "containerfile",
                          "mounts", "env", "annotations", "devices", "sources", "hook_env",
                          "warnings"]
    assert data["containerfile"] is None
    assert data["devices"] == ["vendor.example/nic=nic0"]
    assert data["sources"]["devices.vendor.example/nic=nic0"] == str(site / "edf" / "site.toml")
    assert data["mounts"] == ["/scratch/u:/scratch", "/home:/home:ro"]
    assert data["writable"] is True and data["entrypoint"] is False
    assert data["sources"]["workdir"] == str(site / "edf" / "site.toml")
    assert data["hook_env"] == {"BERTH_HOOK_PMIX_ENABLE": "1", "BERTH_HOOK_OFI_NCCL_ENABLE": "1",
                                "BERTH_HOOK_OFI_NCCL_VERSION": "cuda12"}


def test_check_is_silent_on_success_and_one_line_on_failure(site, run):
    write(site / "edf", "site.toml", SITE)
    write(site / "edf", "pytorch.toml", PYTORCH)
    assert run("edf", "check", "pytorch") == (0, "", "")
    bad = write(site / "edf", "bad.toml", 'base_environment = "pytorch"\nentrypoint = "yes"\n')
    status, out, err = run("edf", "check", str(bad))
    assert (status, out) == (1, "")
    assert err == f"berth: error: {bad}:2: 'entrypoint' must be a boolean, not a string\n"


def test_show_spank_lines_are_the_plugins_flag_vocabulary(site, run):
    write(site / "edf", "site.toml", SITE)
    write(site / "edf", "pytorch.toml", PYTORCH.replace('"ODD KEY" = "tab', 'ODD = "tab'))
    status, out, err = run("edf", "show", "--spank", "pytorch")
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        "image=nvcr.io#nvidia/pytorch:24.01-py3",
        "workdir=/workspace",
        "entrypoint=no",
        "writable=yes",
        "mount=/scratch/u:/scratch",
        "mount=/home:/home:ro",
        "device=vendor.example/nic=nic0",
        "env=NCCL_DEBUG=WARN",
        'env=ODD=tab\tquote"back\\slash\x7f',
        "hook_env=BERTH_HOOK_PMIX_ENABLE=1",
        "hook_env=BERTH_HOOK_OFI_NCCL_ENABLE=1",
        "hook_env=BERTH_HOOK_OFI_NCCL_VERSION=cuda12",
    ]


def test_show_spank_leaves_out_unset_values(site, run):
    write(site / "edf", "bare.toml", 'image = "/images/x.sqsh"\n')
    assert run("edf", "show", "--spank", "bare") == (0, "image=/images/x.sqsh\n", "")


@pytest.mark.parametrize("text, expected", [
    ('image = "x"\n[env]\nA = "one\\ntwo"\n', "'env' has a newline"),
    ('image = "x"\nmounts = ["/a,b:/b"]\n', "mount '/a,b:/b' has a ','"),
])
def test_show_spank_refuses_what_one_line_cannot_carry(site, run, text, expected):
    path = write(site / "edf", "odd.toml", text)
    status, out, err = run("edf", "show", "--spank", "odd")
    assert (status, out) == (1, "")
    assert err.startswith(f"berth: error: {path}: ") and expected in err
    assert err.count("\n") == 1


def test_show_takes_one_output_form(site, run, capsys):
    write(site / "edf", "bare.toml", 'image = "x"\n')
    with pytest.raises(SystemExit):
        run("edf", "show", "--json", "--spank", "bare")
    assert "not allowed with argument" in capsys.readouterr().err


def test_sqsh_and_enroot_mount_flags_are_accepted(site):
    write(site / "edf", "data.toml", 'mounts = ["${SCRATCH}/data.sqsh:/data:sqsh", '
          '"/a:/b:ro+rprivate+unbindable+nosuid", "tmpfs:/t:size=1g"]\n')
    assert resolve(site, "data", SCRATCH="/scratch")["mounts"] == [
        "/scratch/data.sqsh:/data:sqsh", "/a:/b:ro+rprivate+unbindable+nosuid", "tmpfs:/t:size=1g"]


def test_base_environment_nests_at_most_ten_levels(site):
    d = site / "edf"
    for level in range(11):  # l0 (the top) ... l10: ten levels of parents
        parent = f'base_environment = "l{level + 1}"\n' if level < 10 else ""
        write(d, f"l{level}.toml", f'{parent}env.L{level} = "{level}"\n')
    assert len(resolve(site, "l0")["env"]) == 11
    write(d, "l10.toml", 'base_environment = "l11"\n')
    write(d, "l11.toml", "")
    message = failure(site, "l0")
    assert message.startswith("base_environment nests deeper than 10 levels: l0 -> l1 -> ")
    assert message.endswith("l10 -> l11")


# ---------------------------------------------------------------- the CSCS talk's EDFs
# The four EDFs of the CSCS talk "Containers-First User Environments on HPE
# Cray EX", as written there but for their images' and files' paths (and the
# devtools one's `containerfile` key, which is not this file's), resolved
# against a hooks.d holding the hooks Berth ships.

SHIPPED = sorted(Path(__file__).resolve().parents[2].joinpath("hooks").glob("*.sh"))
# (as files: the clusters' verify runs two of them through srun too)
TALK_EDFS = Path(__file__).resolve().parent / "talk_edfs"

DEVTOOLS = """
base_environment = ["parent_env0", "research_group_env"]
image = "nvcr.io/nvidia/nvhpc:23.11-devel-cuda_multi-ubuntu22.04"
entrypoint = false
writable = true
mounts = [
    "/capstor/scratch/cscs/u/tools:/tools",
    "${SCRATCH}/data:/workdir/data",
    "/users/u/.config:/config:ro",
]

[env]
MELLANOX_VISIBLE_DEVICES = "none"
CONFDIR = "/config"
UNSET_BEFORE_RUNNING = ""

[annotations]
com.hooks.cxi.enable = true
com.hooks.ofi_nccl.version = "cuda12"
"""
FOURCASTNET = (TALK_EDFS / "fourcastnet.toml").read_text()
CSCS_MLP = (TALK_EDFS / "cscs-mlp.toml").read_text()
USE_CASE = """
base_environment = "cscs-mlp"
image = "nvcr.io/nvidia/pytorch:24.01-py3"
"""


@pytest.fixture
def cluster(site):
    """`site` with hooks.d holding the shipped hooks' names, and the talk's parents."""
    hooks = site / "sysconf" / "hooks.d"
    for hook in hooks.glob("*.sh"):
        hook.unlink()
    for hook in SHIPPED:
        (hooks / hook.name).write_text("#!/bin/sh\n")
    write(site / "edf", "parent_env0.toml", 'workdir = "/workdir"\n[env]\nCONFDIR = "/etc/x"\n'
          'PARENT = "0"\n')
    write(site / "edf", "research_group_env.toml", 'mounts = ["/store/group:/group:ro"]\n'
          '[annotations]\ncom.hooks.aws_ofi_nccl.variant = "cuda11"\n')
    return site


def talk_environ(site):
    return {"SCRATCH": "/capstor/scratch/cscs/u", "HOME": str(site / "home")}


def test_the_talks_devtools_edf_resolves_as_written(cluster):
    write(cluster / "edf", "devtools.toml", DEVTOOLS)
    got = resolve(cluster, "devtools", **talk_environ(cluster))
    # written for Docker, the registry named as enroot and pyxis name it
    assert got["image"] == "nvcr.io#nvidia/nvhpc:23.11-devel-cuda_multi-ubuntu22.04"
    assert (got["workdir"], got["entrypoint"], got["writable"]) == ("/workdir", False, True)
    assert got["mounts"] == ["/store/group:/group:ro", "/capstor/scratch/cscs/u/tools:/tools",
                             "/capstor/scratch/cscs/u/data:/workdir/data",
                             "/users/u/.config:/config:ro"]
    assert got["env"] == {"CONFDIR": "/config", "PARENT": "0",
                          "MELLANOX_VISIBLE_DEVICES": "none", "UNSET_BEFORE_RUNNING": ""}
    # the child's ofi_nccl.version replaces the parent's aws_ofi_nccl.variant
    assert got["hook_env"]["BERTH_HOOK_AWS_OFI_NCCL_VARIANT"] == "cuda12"
    assert "com.hooks.aws_ofi_nccl.variant" not in got["annotations"]
    assert got["hook_env"] == {"BERTH_HOOK_CXI_ENABLE": "1",
                               "BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda12"}
    assert got["warnings"] == []


def test_the_talks_edf_on_a_cluster_without_slingshot_warns_and_goes_on(cluster):
    (cluster / "sysconf" / "hooks.d" / "88-cxi.sh").unlink()
    path = write(cluster / "edf", "devtools.toml", DEVTOOLS)
    got = resolve(cluster, "devtools", **talk_environ(cluster))
    assert got["hook_env"] == {"BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda12"}
    [warning] = got["warnings"]
    assert warning.startswith(f"{path}: annotation 'com.hooks.cxi.enable' is for hook 'cxi', "
                              f"which is not installed in ")


def test_the_talks_fourcastnet_edf_resolves_as_written(cluster):
    write(cluster / "edf", "fourcastnet.toml", FOURCASTNET)
    got = resolve(cluster, "fourcastnet", **talk_environ(cluster))
    scratch = "/capstor/scratch/cscs/u/fcn-collaboration"
    assert got["image"] == f"{scratch}/ml+fourcastnet+22.12.sqsh"
    assert len(got["mounts"]) == 5
    assert f"{scratch}/model weights:/data/weights" in got["mounts"]
    assert got["hook_env"] == {"BERTH_HOOK_CXI_ENABLE": "1",
                               "BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda11"}


def test_the_talks_site_base_and_use_case_resolve_as_written(cluster):
    write(cluster / "edf", "cscs-mlp.toml", CSCS_MLP)
    write(cluster / "edf", "use-case.toml", USE_CASE)
    got = resolve(cluster, "use-case", **talk_environ(cluster))
    home = cluster / "home"
    assert got["image"] == "nvcr.io#nvidia/pytorch:24.01-py3"
    assert got["mounts"] == [f"{home}/.bash_history:/.bash_history",
                             "/capstor/scratch/cscs/u:/capstor/scratch/cscs/u", "/tmp:/tmp"]
    assert got["env"] == {"HISTFILE": "/.bash_history"}
    assert got["hook_env"] == {"BERTH_HOOK_CXI_ENABLE": "1",
                               "BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda12"}
    assert got["sources"]["image"] == str(cluster / "edf" / "use-case.toml")
    assert got["sources"]["env.HISTFILE"] == str(cluster / "edf" / "cscs-mlp.toml")


@pytest.mark.parametrize("annotations, expected", [
    ('com.hooks.ofi_nccl.version = "cuda12"\ncom.hooks.aws_ofi_nccl.variant = "cuda11"',
     "annotations 'com.hooks.ofi_nccl.version' and 'com.hooks.aws_ofi_nccl.variant' disagree"),
    ('com.hooks.cxi.enable = true\ncom.hooks.cxi.enabled = "false"',
     "annotations 'com.hooks.cxi.enable' and 'com.hooks.cxi.enabled' disagree"),
    ('com.hooks.ofi_nccl.enable = false\ncom.hooks.aws_ofi_nccl.enabled = "true"',
     "annotations 'com.hooks.ofi_nccl.enable' and 'com.hooks.aws_ofi_nccl.enabled' disagree"),
    ('com.hooks.ssh.prot = 2222', "hook 'ssh' takes no annotation 'com.hooks.ssh.prot' (it "
     "takes com.hooks.ssh.authorize_ssh_key, com.hooks.ssh.enable, com.hooks.ssh.enabled, "
     "com.hooks.ssh.port)"),
    ('com.hooks.ofi_nccl.varient = "cuda12"', "hook 'aws_ofi_nccl' takes no annotation "
     "'com.hooks.ofi_nccl.varient' (it takes com.hooks.ofi_nccl.enable, "
     "com.hooks.ofi_nccl.enabled, com.hooks.ofi_nccl.version)"),
])
def test_spellings_that_contradict_or_misspell_are_refused(cluster, annotations, expected):
    path = write(cluster / "edf", "h.toml", f'image = "x"\n[annotations]\n{annotations}\n')
    assert failure(cluster, "h") == f"{path}: {expected}"


def test_two_spellings_that_agree_are_one_setting(cluster):
    write(cluster / "edf", "h.toml", 'image = "x"\n[annotations]\n'
          'com.hooks.ofi_nccl.version = "cuda12"\ncom.hooks.aws_ofi_nccl.variant = "cuda12"\n'
          'com.hooks.aws_ofi_nccl.enabled = "true"\ncom.hooks.ofi_nccl.enable = true\n')
    assert resolve(cluster, "h")["hook_env"] == {"BERTH_HOOK_AWS_OFI_NCCL_VARIANT": "cuda12",
                                                 "BERTH_HOOK_AWS_OFI_NCCL_ENABLE": "1"}


def test_the_vocabulary_is_what_the_shipped_hooks_read():
    """Every BERTH_HOOK_NAME_* variable a shipped hook reads has annotations in
    the table, and every row of the table reaches a variable its hook reads."""
    read = {}
    for path in SHIPPED:
        name = path.stem.split("-", 1)[1]
        code = "\n".join(line for line in path.read_text().splitlines()
                         if not line.lstrip().startswith("#"))
        read[name] = set(re.findall(rf"\bBERTH_HOOK_{annotations.env_name(name)}_[A-Z0-9_]+\b",
                                    code))
    in_table = {}
    for row in annotations.TABLE:
        in_table.setdefault(row.hook, set()).add(row.variable)
    assert {hook: variables for hook, variables in read.items() if variables} == in_table


def test_devices_are_appended_once_each_parents_first(site):
    write(site / "edf", "base.toml", 'devices = ["vendor.example/nic=nic0", '
          '"vendor.example/gpu=g0"]\n')
    child = write(site / "edf", "child.toml", 'base_environment = "base"\nimage = "x"\n'
                  'devices = ["vendor.example/gpu=g0", "vendor.example/nic=nic1"]\n')
    got = resolve(site, "child")
    assert got["devices"] == ["vendor.example/nic=nic0", "vendor.example/gpu=g0",
                              "vendor.example/nic=nic1"]
    assert got["sources"]["devices.vendor.example/gpu=g0"] == str(site / "edf" / "base.toml")
    assert got["sources"]["devices.vendor.example/nic=nic1"] == str(child)
    assert [line for line in edf.to_spank(got).splitlines() if line.startswith("device=")] == [
        "device=vendor.example/nic=nic0", "device=vendor.example/gpu=g0",
        "device=vendor.example/nic=nic1"]
    assert tomllib.loads(edf.to_toml(got))["devices"] == got["devices"]
