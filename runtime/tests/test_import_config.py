"""The image configuration inside an imported root: the contract with start/SPANK."""

import json
import os
import subprocess

import pytest

from berth.errors import BerthError
from berth.image.imageconfig import from_oci, read_image_config, write_image_config

DIGEST = "sha256:" + "cd" * 32


def image(**settings):
    return from_oci({"architecture": "amd64", "config": settings}, "docker://x", DIGEST)


def run_rc(root, *args):
    return subprocess.run(["sh", str(root / "etc/rc"), *args], capture_output=True,
                          text=True, check=True).stdout


def test_contract_from_an_empty_config():
    assert from_oci({}, "docker://x", DIGEST) == {
        "env": [], "entrypoint": None, "cmd": None, "workdir": "", "user": "",
        "source": "docker://x", "digest": DIGEST}


def test_round_trip_and_enroot_files(tmp_path):
    written = image(Env=["A=1", "B=two words"], Entrypoint=["printf", "%s|"],
                    Cmd=["it's", "$HOME"], User="1000:1000")
    write_image_config(tmp_path, written)
    assert read_image_config(tmp_path) == written
    assert (tmp_path / "etc/environment").read_text() == "A=1\nB=two words\n"
    assert os.access(tmp_path / "etc/rc", os.X_OK)
    # Entrypoint and command reach exec word for word, no shell expansion.
    assert run_rc(tmp_path) == "it's|$HOME|"
    assert run_rc(tmp_path, "echo", "given") == "given\n"  # the caller's command wins


def test_rc_without_a_command_starts_a_login_shell(tmp_path):
    write_image_config(tmp_path, image(WorkingDir="/"))
    script = (tmp_path / "etc/rc").read_text()
    assert script.splitlines()[2:] == ["cd / || exit 1", 'if [ "$#" -gt 0 ]; then exec "$@"; fi',
                                       "exec /bin/sh -l"]


def test_links_in_the_image_are_replaced_not_followed(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "etc").mkdir(parents=True)
    outside.mkdir()
    (outside / "rc").write_text("keep")
    (root / "etc/rc").symlink_to(outside / "rc")
    (root / "etc/berth").symlink_to("/../../outside")
    write_image_config(root, image())
    assert (outside / "rc").read_text() == "keep"
    assert sorted(os.listdir(outside)) == ["rc"]
    assert read_image_config(root)["source"] == "docker://x"


def test_missing_or_broken_image_json(tmp_path):
    with pytest.raises(BerthError, match="etc/berth/image.json is missing: not a root made by"):
        read_image_config(tmp_path)
    (tmp_path / "etc/berth").mkdir(parents=True)
    path = tmp_path / "etc/berth/image.json"
    path.write_text("{")
    with pytest.raises(BerthError, match="image.json: Expecting"):
        read_image_config(tmp_path)
    path.write_text(json.dumps(dict(image(), cmd="echo")))
    with pytest.raises(BerthError, match="key 'cmd' missing or of the wrong type"):
        read_image_config(tmp_path)


@pytest.mark.parametrize("key, value, needle", [
    ("env", ["A=1", 5], "key 'env' holds an entry that is not a string"),
    ("env", ["A=1", None], "key 'env' holds an entry that is not a string"),
    ("entrypoint", [["nested"]], "key 'entrypoint' holds an entry that is not a string"),
    ("cmd", ["echo\0hidden"], "key 'cmd' holds a NUL character"),
    ("workdir", "/tmp\0x", "key 'workdir' holds a NUL character"),
])
def test_image_json_entries_of_the_wrong_type_are_one_error(tmp_path, key, value, needle):
    """image.json is read at every start (rootfs.image_config): a squashfs made
    elsewhere may hold anything there."""
    from berth.container.rootfs import image_config
    write_image_config(tmp_path, image())
    path = tmp_path / "etc/berth/image.json"
    path.write_text(json.dumps(dict(image(), **{key: value})))
    with pytest.raises(BerthError, match=f"image.json: {needle}"):
        read_image_config(tmp_path)
    with pytest.raises(BerthError, match=f"image.json: {needle}"):
        image_config(str(tmp_path))


def test_image_json_nested_too_deeply(tmp_path):
    (tmp_path / "etc/berth").mkdir(parents=True)
    (tmp_path / "etc/berth/image.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BerthError, match="image.json: nested too deeply"):
        read_image_config(tmp_path)


@pytest.mark.parametrize("settings, needle", [
    ({"Entrypoint": "/bin/sh -c app"}, "config.Entrypoint is a string, not a list of strings"),
    ({"WorkingDir": 7}, "config.WorkingDir is a number, not a string"),
    ({"Env": ["A=1", 2]}, "config.Env is a list holding a non-string, not a list of strings"),
    ({"Cmd": {"a": 1}}, "config.Cmd is an object, not a list of strings"),
    ({"User": True}, "config.User is a boolean, not a string"),
])
def test_image_config_fields_of_the_wrong_type(settings, needle):
    with pytest.raises(BerthError, match=f"^the image config of docker://x: {needle}$"):
        image(**settings)


def test_image_config_that_is_no_object():
    with pytest.raises(BerthError, match="'config' is a list, not an object"):
        from_oci({"config": ["Env"]}, "docker://x", DIGEST)
    with pytest.raises(BerthError, match="the image config of docker://x is not a JSON object"):
        from_oci([1, 2], "docker://x", DIGEST)
