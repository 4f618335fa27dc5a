"""CDI devices through `berth start --device`, in real starts.

No vendor's device is here: the devices are fabricated, character device
nodes made with mknod in the test's own root-owned directory (the numbers
of /dev/null, so that opening one is harmless), with JSON and YAML specs
beside them naming them, a directory the container mounts and an OCI hook
that keeps the container state it is given.
"""

import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

from container_fixture import start_detached

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned specs and mknod")

JSON_SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "vendor.example/nic",
    "containerEdits": {"env": ["NIC_SPEC=common"]},
    "devices": [
        {"name": "nic0", "containerEdits": {
            "env": ["NIC_VISIBLE=0"],
            "deviceNodes": [{"path": "/dev/nic0", "hostPath": "{node}/nic0"}]}},
        {"name": "nic1", "containerEdits": {
            "env": ["NIC_VISIBLE=1"],
            "deviceNodes": [{"path": "/dev/nic1", "hostPath": "{node}/nic1"}]}},
    ],
}
YAML_SPEC = """\
cdiVersion: "0.6.0"
kind: vendor.example/gpu
devices:
  - name: g0
    containerEdits:
      env: [GPU_VISIBLE=g0]
      mounts:
        - hostPath: {node}/share
          containerPath: /opt/vendor
          options: [ro, nosuid]
      hooks:
        - hookName: createContainer
          path: {node}/keep-state
          args: [keep-state, {state}]
          env: [HOOK_SAYS=hello]
"""
HOOK = """#!/bin/sh
{ cat; echo; echo "$HOOK_SAYS $#"; } >"$1"
"""


@pytest.fixture
def node(berth):
    """A root-owned directory (0755) with the specs, the device nodes, the
    mounted directory and the hook; berth's BERTH_CDI_SPEC_DIRS names it."""
    top = Path(tempfile.mkdtemp(prefix="bcdi-"))
    top.chmod(0o755)
    specs = top / "cdi"
    specs.mkdir()
    for name in ("nic0", "nic1"):
        os.mknod(top / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (top / "share").mkdir()
    (top / "share" / "lib.txt").write_text("the vendor's library\n")
    (top / "keep-state").write_text(HOOK)
    (top / "keep-state").chmod(0o755)
    state = berth.base / "host" / "state"
    text = json.dumps(JSON_SPEC).replace("{node}", str(top))
    (specs / "nic.json").write_text(text)
    (specs / "gpu.yaml").write_text(YAML_SPEC.format(node=top, state=state))
    berth.env["BERTH_CDI_SPEC_DIRS"] = f"{specs}:{top / 'not-there'}"
    # a /dev of the container's own (a tmpfs), where the node's has no /dev/nic0 to bind over
    berth.env["ENROOT_RESTRICT_DEV"] = "yes"
    yield {"top": top, "specs": specs, "state": state}
    shutil.rmtree(top)


SHOW = ("echo $NIC_SPEC $NIC_VISIBLE $GPU_VISIBLE; stat -c '%F %t:%T' /dev/nic0; "
        "cat /opt/vendor/lib.txt; touch /opt/vendor/x 2>/dev/null || echo read-only")


def test_devices_of_json_and_yaml_specs_reach_the_container(berth, app, node):
    out = berth.ok("start", "--device", "vendor.example/nic=nic0", "--device",
                   "vendor.example/gpu=g0", "-e", "GPU_VISIBLE=mine", "app", "sh", "-c", SHOW)
    assert out.splitlines() == ["common 0 mine", "character special file 1:3",
                                "the vendor's library", "read-only"]
    state, said = node["state"].read_text().splitlines()
    state = json.loads(state)
    assert said == "hello 1"  # its env and args, as the spec gives them
    assert (state["ociVersion"], state["status"]) == ("1.0.2", "created")
    assert isinstance(state["pid"], int) and state["bundle"].startswith("/")
    assert berth.leftovers() == []


def test_only_the_devices_asked_for_are_bound(berth, app, node):
    out = berth.ok("start", "--device", "vendor.example/nic=nic1", "app", "sh", "-c",
                   "echo $NIC_VISIBLE; ls /dev/nic0 2>&1 >/dev/null | wc -l; ls /dev/nic1")
    assert out.splitlines() == ["1", "1", "/dev/nic1"]
    assert not node["state"].exists()  # the gpu's hook is not run


def test_a_spec_another_user_could_write_is_skipped_with_a_warning(berth, app, node):
    spec = node["specs"] / "gpu.yaml"
    os.chown(spec, berth.user.pw_uid, berth.user.pw_gid)
    result = berth("start", "--device", "vendor.example/nic=nic0", "app", "true")
    assert result.returncode == 0
    assert result.stderr == (f"berth: warning: CDI spec {spec}: owned by uid "
                             f"{berth.user.pw_uid}, not root: skipped\n")
    result = berth("start", "--device", "vendor.example/gpu=g0", "app", "true")
    assert result.returncode == 1
    assert result.stderr.splitlines()[1] == ("berth: error: --device vendor.example/gpu=g0: no "
                                             "CDI spec on this node has it (kinds here: "
                                             "vendor.example/nic)")
    assert not node["state"].exists() and berth.leftovers() == []


def test_a_writable_spec_directory_is_skipped(berth, app, node):
    node["specs"].chmod(0o777)
    result = berth("start", "--device", "vendor.example/nic=nic0", "app", "true")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"berth: warning: CDI spec directory {node['specs']}: writable by others than root "
        f"(mode 0777): skipped",
        "berth: error: --device vendor.example/nic=nic0: no CDI spec on this node has it "
        "(kinds here: none)"]


@pytest.mark.parametrize("name, text, why", [
    ("broken.json", '{"kind": ', "not valid JSON"),
    ("broken.yaml", "kind: [unclosed\n", "not valid YAML"),
    ("nokind.json", '{"devices": [{"name": "x"}]}', "'kind' must be VENDOR/CLASS, not None"),
], ids=["json", "yaml", "no-kind"])
def test_a_malformed_spec_is_named_and_hides_no_other(berth, app, node, name, text, why):
    bad = node["specs"] / name
    bad.write_text(text)
    result = berth("start", "--device", "vendor.example/nic=nic0", "app", "sh", "-c",
                   "echo $NIC_VISIBLE")
    assert (result.returncode, result.stdout) == (0, "0\n")
    [warning] = result.stderr.splitlines()
    assert warning.startswith(f"berth: warning: CDI spec {bad}: {why}")
    assert warning.endswith(": skipped")


def test_two_specs_claiming_one_name_start_nothing(berth, app, node):
    again = node["specs"] / "again.json"
    shutil.copy(node["specs"] / "nic.json", again)
    berth.fails("start", "--device", "vendor.example/nic=nic0", "app", "true",
                needle=f"--device vendor.example/nic=nic0: claimed by two CDI specs of one "
                       f"directory, {again} and {node['specs'] / 'nic.json'}")


def test_a_later_spec_directory_wins_a_name_both_have(berth, app, node):
    """CDI's order, /etc/cdi then /var/run/cdi: the later directory's spec
    of a name is the one applied (NVIDIA's refresh service writes
    /var/run/cdi/nvidia.yaml where the bundle wrote /etc/cdi/nvidia.yaml)."""
    later = node["top"] / "run-cdi"
    later.mkdir()
    spec = json.loads((node["specs"] / "nic.json").read_text())
    spec["containerEdits"]["env"] = ["NIC_SPEC=later"]
    (later / "nic.json").write_text(json.dumps(spec))
    berth.env["BERTH_CDI_SPEC_DIRS"] = f"{node['specs']}:{later}"
    out = berth.ok("start", "--device", "vendor.example/nic=nic0", "app", "sh", "-c",
                   "echo $NIC_SPEC $NIC_VISIBLE")
    assert out.splitlines() == ["later 0"]


@pytest.mark.parametrize("device, needle", [
    ("vendor.example/nic=nic9", "no CDI spec on this node has it (kinds here: "
                                "vendor.example/gpu, vendor.example/nic)"),
    ("nic0", "--device nic0: not a CDI device name (VENDOR/CLASS=DEVICE"),
])
def test_unknown_names_start_nothing(berth, app, node, device, needle):
    berth.fails("start", "--device", device, "app", "true", needle=needle)


@pytest.mark.parametrize("missing, needle", [
    ("nic0", "device node {top}/nic0 is missing on this node"),
    ("share", "mount source {top}/share is missing on this node"),
    ("keep-state", "hook program {top}/keep-state is missing on this node"),
])
def test_a_missing_node_source_or_hook_starts_nothing(berth, app, node, missing, needle):
    path = node["top"] / missing
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    device = "vendor.example/nic=nic0" if missing == "nic0" else "vendor.example/gpu=g0"
    line = berth.fails("start", "--device", device, "app", "true",
                       needle=needle.format(top=node["top"]))
    assert line.startswith(f"berth: error: CDI device {device} (")
    assert not node["state"].exists()


def test_a_link_to_another_users_spec_is_not_followed(berth, app, node):
    """Root's directory, but a link in it leads to a file the user wrote."""
    theirs = berth.write("host/evil.json", json.dumps(
        {"kind": "vendor.example/evil", "devices": [{"name": "x", "containerEdits": {
            "mounts": [{"hostPath": "/etc", "containerPath": "/stolen"}]}}]}))
    link = node["specs"] / "evil.json"
    link.symlink_to(theirs)
    result = berth("start", "--device", "vendor.example/evil=x", "app", "true")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0].startswith(f"berth: warning: CDI spec {link}: ")
    assert "kinds here: vendor.example/gpu, vendor.example/nic" in result.stderr


def test_a_failing_hook_fails_the_start_in_its_words(berth, app, node):
    hook = node["top"] / "keep-state"
    hook.write_text("#!/bin/sh\necho 'no such GPU here' >&2\nexit 3\n")
    berth.fails("start", "--device", "vendor.example/gpu=g0", "app", "true",
                needle=f"CDI device vendor.example/gpu=g0 ({node['specs'] / 'gpu.yaml'}): hook "
                       f"{hook} failed with exit status 3: no such GPU here")


# ---------------------------------------------------------------- hook stages and timeouts

STAGE_HOOK = """#!/usr/bin/python3
import json, sys
state = json.load(sys.stdin)
name, log = sys.argv[1], sys.argv[2]
line = name
if name.startswith("poststart"):
    with open(f"/proc/{state['pid']}/comm") as f:
        line += f" {state['status']} {f.read().strip()}"
if name.startswith("poststop"):
    line += f" {state['status']} {'pid' in state}"
with open(log, "a") as f:
    f.write(line + "\\n")
if name.endswith("-fails"):
    sys.exit(f"{name.partition('-')[0]} says no")
"""


@pytest.fixture
def stages(berth, node):
    """A spec, kind vendor.example/stages, whose device `s` has hooks that
    log their stage; its `order` is the spec's: not the order they run in."""
    hook = node["top"] / "stage-hook"
    hook.write_text(STAGE_HOOK)
    hook.chmod(0o755)
    log = berth.base / "host" / "stages.log"
    log.parent.mkdir(exist_ok=True)
    berth.chown(log.parent)

    def write(*entries, kind="stages"):
        """Each entry (hookName, name[, timeout]); the hook is stage-hook
        unless the name is a path (a program of the test's own)."""
        hooks = []
        for stage, name, *timeout in entries:
            path, args = ((name, [name]) if name.startswith("/")
                          else (str(hook), ["stage-hook", name, str(log)]))
            hooks.append({"hookName": stage, "path": path, "args": args,
                          **({"timeout": timeout[0]} if timeout else {})})
        spec = {"cdiVersion": "0.6.0", "kind": f"vendor.example/{kind}",
                "devices": [{"name": "s", "containerEdits": {"hooks": hooks}}]}
        path = node["specs"] / f"{kind}.json"
        path.write_text(json.dumps(spec))
        return path
    return {"write": write, "log": log, "top": node["top"]}


def test_hooks_run_in_the_order_of_their_stages(berth, app, stages):
    stages["write"](("poststop", "poststop"), ("startContainer", "start"),
                    ("poststart", "poststart"), ("createContainer", "create"),
                    ("prestart", "prestart"), ("createRuntime", "runtime"))
    berth.ok("start", "--device", "vendor.example/stages=s", "app", "sleep", "1")
    # poststart once the command runs: its process is the command, not berth's
    # setup; poststop once it has ended, when the container has no process
    assert stages["log"].read_text().splitlines() == [
        "prestart", "runtime", "create", "start", "poststart running sleep",
        "poststop stopped False"]
    assert berth.leftovers() == []


@pytest.mark.parametrize("stage", ["poststart", "poststop"])
def test_a_failing_late_hook_is_a_warning_and_keeps_the_exit_status(berth, app, stages, stage):
    spec = stages["write"]((stage, f"{stage}-fails"), (stage, f"{stage}-after"))
    result = berth("start", "--device", "vendor.example/stages=s", "app", "sh", "-c",
                   "echo ran; sleep 1; exit 3")
    assert (result.returncode, result.stdout) == (3, "ran\n")
    assert result.stderr == (f"berth: warning: CDI device vendor.example/stages=s ({spec}): hook "
                             f"{stages['top'] / 'stage-hook'} failed with exit status 1: "
                             f"{stage} says no\n")
    assert [line.split()[0] for line in stages["log"].read_text().splitlines()] == [
        f"{stage}-fails", f"{stage}-after"]  # the rest still run
    assert berth.leftovers() == []


def _sleeper(top, marker):
    path = top / "sleeper"
    path.write_text(f"#!/bin/sh\n/bin/sleep {marker} &\n/bin/sleep {marker}\n")
    path.chmod(0o755)
    return str(path)


def _running(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_a_hook_past_its_timeout_fails_the_start_and_leaves_nothing(berth, app, stages):
    marker = "29.25"  # the sleeps' own argument, to find them by
    sleeper = _sleeper(stages["top"], marker)
    spec = stages["write"](("createContainer", sleeper, 1))
    started = time.monotonic()
    berth.fails("start", "--device", "vendor.example/stages=s", "app", "true",
                needle=f"CDI device vendor.example/stages=s ({spec}): createContainer hook "
                       f"{sleeper} has not finished after 1 s (the spec's timeout): killed")
    assert time.monotonic() - started < 15
    assert _running(marker) == []  # nor what it started in the background


def test_a_poststart_hook_past_its_timeout_is_a_warning(berth, app, stages):
    sleeper = _sleeper(stages["top"], "29.5")
    spec = stages["write"](("poststart", sleeper, 1))
    result = berth("start", "--device", "vendor.example/stages=s", "app", "echo", "ran")
    assert (result.returncode, result.stdout) == (0, "ran\n")
    assert result.stderr == (f"berth: warning: CDI device vendor.example/stages=s ({spec}): "
                             f"poststart hook {sleeper} has not finished after 1 s (the spec's "
                             f"timeout): killed\n")
    assert _running("29.5") == []


@pytest.mark.parametrize("timeout", [0, -1, "5", 1.5])
def test_a_timeout_that_is_not_whole_seconds_starts_nothing(berth, app, stages, timeout):
    stages["write"](("createContainer", "create", timeout))
    berth.fails("start", "--device", "vendor.example/stages=s", "app", "true",
                needle=f"'timeout' must be a number of seconds above 0, not {timeout!r}")
    assert not stages["log"].exists()


def test_poststop_hooks_run_after_a_start_that_failed_in_its_hooks(berth, app, stages):
    # OCI: a failed create still goes on to delete, whose poststop hooks
    # undo what the earlier hooks did
    spec = stages["write"](("createContainer", "create"), ("startContainer", "start-fails"),
                           ("poststop", "poststop"))
    berth.fails("start", "--device", "vendor.example/stages=s", "app", "true",
                needle=f"CDI device vendor.example/stages=s ({spec}): hook "
                       f"{stages['top'] / 'stage-hook'} failed with exit status 1: start says no")
    assert stages["log"].read_text().splitlines() == [
        "create", "start-fails", "poststop stopped False"]
    assert berth.leftovers() == []


def test_a_stage_oci_does_not_have_starts_nothing(berth, app, stages):
    stages["write"](("postStop", "stop"))
    berth.fails("start", "--device", "vendor.example/stages=s", "app", "true",
                needle="stage 'postStop' is not one of OCI's (prestart, createRuntime, "
                       "createContainer, startContainer, poststart, poststop)")
    assert not stages["log"].exists()


def test_poststart_hooks_have_run_when_detach_says_its_pid(berth, app, stages):
    stages["write"](("poststart", "poststart"), ("poststop", "poststop"))
    process, pid = start_detached(berth, "--device", "vendor.example/stages=s", "app")
    try:
        # the keeper, the container's process, is what the hook found running
        assert stages["log"].read_text() == "poststart running sh\n"
        assert os.path.exists(f"/proc/{pid}")
    finally:
        process.stdin.close()
        assert process.wait(timeout=30) == 0
    # poststop once the keeper is stopped, before berth has exited
    assert stages["log"].read_text() == "poststart running sh\npoststop stopped False\n"
    assert berth.leftovers() == []
