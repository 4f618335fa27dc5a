"""`berth import` end to end against a real registry (Debian's docker-registry)."""

import contextlib
import fcntl
import hashlib
import os
import platform
import pty
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import (
    DOCKER_MANIFEST,
    Proxy,
    Registry,
    berth,
    berth_env,
    gzipped,
    imports_at_once,
    layer_tar,
    listing,
    unsquash,
    zstd_compressed,
)

from berth.image.imageconfig import read_image_config

pytestmark = pytest.mark.skipif(not shutil.which("docker-registry"),
                                reason="needs docker-registry (Debian package docker-registry)")

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
OTHER_ARCH = "arm64" if HOST_ARCH != "arm64" else "amd64"
CONFIG = {"architecture": HOST_ARCH, "os": "linux", "config": {
    "Env": ["PATH=/usr/bin:/bin", "GREETING=hello world"],
    "Entrypoint": ["echo"], "Cmd": ["from", "the image"], "WorkingDir": "/tmp"}}
BASE = layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=berth\n"),
                 ("file", "etc/old", b"old"), ("dir", "opt"), ("file", "opt/lower", b"l"),
                 ("dir", "usr"), ("dir", "usr/bin"),
                 ("file", "usr/bin/tool", b"#!/bin/sh\n", 0o755),
                 ("symlink", "bin", "usr/bin"))
TOP = layer_tar(("file", "etc/.wh.old", b""), ("dir", "opt"), ("file", "opt/.wh..wh..opq", b""),
                ("file", "opt/upper", b"u"), ("file", "etc/added", b"added\n"))


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A registry holding: test/app (Docker manifest, gzip), test/zstd (OCI,
    zstd), test/multi (an index: host arch and one other), test/big and
    test/big-through-link."""
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.app_digest = reg.push_image("test/app", "v1", [gzipped(BASE), gzipped(TOP)], CONFIG,
                                    media_type=DOCKER_MANIFEST,
                                    layer_type="application/vnd.docker.image.rootfs.diff.tar.gzip")
    reg.push_image("test/zstd", "v1", [zstd_compressed(BASE), TOP], CONFIG,
                   layer_type="application/vnd.oci.image.layer.v1.tar+zstd")
    other = dict(CONFIG, architecture=OTHER_ARCH)
    reg.push_index("test/multi", "v1", {
        (HOST_ARCH, ""): reg.push_image("test/multi", "host", [gzipped(BASE)], CONFIG),
        (OTHER_ARCH, "v8"): reg.push_image(
            "test/multi", "other", [gzipped(layer_tar(("file", "other", b"")))], other),
    })
    # The same (empty) layer twice, as images of many empty steps have it
    reg.push_image("test/repeated", "v1", [gzipped(BASE), gzipped(layer_tar()), gzipped(TOP),
                                           gzipped(layer_tar())], CONFIG)
    # Incompressible, so its size is what it needs on disk.
    reg.push_image("test/big", "v1", [gzipped(layer_tar(("file", "big", os.urandom(3 << 20))))],
                   CONFIG)
    # The same file written through a lower layer's link: its layers are applied in order
    reg.push_image("test/big-through-link", "v1", [
        gzipped(layer_tar(("dir", "d"), ("symlink", "l", "d"))),
        gzipped(layer_tar(("file", "l/big", os.urandom(3 << 20))))], CONFIG)
    yield reg
    reg.stop()


def layer_digests(registry, repo, tag="v1"):
    manifest = requests.get(f"{registry.url}/v2/{repo}/manifests/{tag}", timeout=10, headers={
        "Accept": f"{DOCKER_MANIFEST}, application/vnd.oci.image.manifest.v1+json"}).json()
    return [layer["digest"] for layer in manifest["layers"]]


def blob_downloads(proxy, digests):
    return [path for path in proxy.blob_requests() if path.rsplit("/", 1)[-1] in digests]


def assert_nothing_left(tmp_path, keep=()):
    """No image, no temporary root, no partial blob or cached image."""
    assert sorted(p.name for p in tmp_path.glob("*.sqsh*")) == sorted(keep)
    assert list((tmp_path / "temp").iterdir()) == []
    blobs = tmp_path / "cache" / "blobs" / "sha256"
    if blobs.exists():
        assert [p.name for p in blobs.iterdir() if p.name.startswith(".")] == []
    images = tmp_path / "cache" / "images"
    if images.exists():
        assert [p.name for p in images.iterdir() if not re.fullmatch(r"[0-9a-f]{64}\.sqsh",
                                                                       p.name)] == []


def test_import_builds_a_self_describing_image(tmp_path, env, proxy, registry):
    uri = f"docker://{proxy.host}#test/app:v1"
    result = berth(["import", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    image = tmp_path / "test+app+v1.sqsh"
    # no progress when stderr is not a terminal: the one line an import ends with
    assert re.fullmatch(rf"berth: imported {re.escape(uri)} to {re.escape(str(image))} "
                        r"\([0-9.]+[BKMG]\) in [0-9]+\.[0-9] s\n", result.stderr), result.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(image.stat().st_mode) == 0o666 & ~umask  # an ordinary file
    root = unsquash(image, tmp_path / "root")
    assert (root / "etc/os-release").read_text() == "ID=berth\n"
    assert (root / "etc/added").read_text() == "added\n"
    assert not (root / "etc/old").exists()  # whiteout
    assert sorted(os.listdir(root / "opt")) == ["upper"]  # opaque directory
    assert os.readlink(root / "bin") == "usr/bin"
    assert stat.S_IMODE((root / "usr/bin/tool").stat().st_mode) == 0o755

    config = read_image_config(root)
    assert config == {"env": ["PATH=/usr/bin:/bin", "GREETING=hello world"],
                      "entrypoint": ["echo"], "cmd": ["from", "the image"], "workdir": "/tmp",
                      "user": "", "source": uri, "digest": registry.app_digest}
    assert (root / "etc/environment").read_text() == \
        "PATH=/usr/bin:/bin\nGREETING=hello world\n"
    rc = str(root / "etc/rc")
    assert subprocess.run(["sh", rc], capture_output=True, text=True).stdout == \
        "from the image\n"
    assert subprocess.run(["sh", rc, "pwd"], capture_output=True, text=True).stdout == "/tmp\n"
    assert_nothing_left(tmp_path, keep=["test+app+v1.sqsh"])


def on_a_terminal(args, env, cwd):
    """Run berth with stderr on a pseudo-terminal; returns (status, what it showed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "berth.cli", *args], env=env, cwd=cwd,
                               stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return process.wait(60), shown.decode(errors="replace")


def test_progress_only_on_a_terminal_and_not_quiet(tmp_path, env, proxy):
    uri = f"docker://{proxy.host}#test/app:v1"
    status, shown = on_a_terminal(["import", "-o", "a.sqsh", uri], env, tmp_path)
    assert status == 0, shown
    assert "downloading" in shown and "packing" in shown
    # mksquashfs's bar, not its thirty lines of statistics: those with --verbose
    assert "100%" in shown and "Exportable Squashfs" not in shown, shown
    assert shown.rstrip().splitlines()[-1].startswith(f"berth: imported {uri} to ")
    status, shown = on_a_terminal(["--verbose", "import", "-o", "v.sqsh", uri],
                                  dict(env, ENROOT_CACHE_PATH=str(tmp_path / "c3")), tmp_path)
    assert status == 0, shown
    assert "Exportable Squashfs" in shown and "Number of files" in shown
    status, shown = on_a_terminal(["--quiet", "import", "-o", "b.sqsh", uri],
                                  dict(env, ENROOT_CACHE_PATH=str(tmp_path / "c2")), tmp_path)
    assert status == 0, shown
    assert shown == ""


def test_second_import_downloads_no_layer(tmp_path, env, proxy, registry):
    layers = layer_digests(registry, "test/app")
    uri = f"docker://{proxy.host}#test/app:v1"
    assert berth(["import", "-o", "first.sqsh", uri], env, tmp_path).returncode == 0
    assert sorted(p.rsplit("/", 1)[-1] for p in blob_downloads(proxy, layers)) == sorted(layers)
    proxy.requests.clear()
    result = berth(["import", "-o", "second.sqsh", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert blob_downloads(proxy, layers) == []
    assert result.stderr.endswith(", from the image cache (nothing downloaded)\n"), result.stderr
    assert "/etc/added" in listing(tmp_path / "first.sqsh")
    assert listing(tmp_path / "first.sqsh") == listing(tmp_path / "second.sqsh")


def test_a_layer_the_image_lists_twice_is_fetched_once_without_waiting_on_itself(
        tmp_path, env, proxy, registry):
    layers = layer_digests(registry, "test/repeated")
    assert len(set(layers)) == 3 and len(layers) == 4
    result = berth(["import", "-o", "repeated.sqsh", f"docker://{proxy.host}#test/repeated:v1"],
                   env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "waiting for another import" not in result.stderr, result.stderr
    fetched = [p.rsplit("/", 1)[-1] for p in blob_downloads(proxy, layers)]
    assert sorted(fetched) == sorted(set(layers))
    assert "/etc/added" in listing(tmp_path / "repeated.sqsh")


def test_concurrent_imports_download_each_layer_once(tmp_path, env, proxy, registry):
    layers = layer_digests(registry, "test/app")
    proxy.blob_delay = 0.5  # both imports are inside the download at once
    uri = f"docker://{proxy.host}#test/app:v1"
    results = imports_at_once(uri, env, tmp_path, "a.sqsh", "b.sqsh")
    assert [r.returncode for r in results.values()] == [0, 0], \
        [r.stderr for r in results.values()]
    assert sorted(p.rsplit("/", 1)[-1] for p in blob_downloads(proxy, layers)) == sorted(layers)
    assert "/etc/added" in listing(tmp_path / "a.sqsh")
    assert listing(tmp_path / "a.sqsh") == listing(tmp_path / "b.sqsh")


@pytest.mark.parametrize("connections, expected", [("1", 1), ("10", 2)])
def test_layers_download_in_parallel(tmp_path, env, proxy, connections, expected):
    proxy.blob_delay = 0.3
    result = berth(["import", f"docker://{proxy.host}#test/app:v1"],
                   dict(env, ENROOT_MAX_CONNECTIONS=connections), tmp_path)
    assert result.returncode == 0, result.stderr
    assert proxy.most_in_flight == expected  # two layers


def test_zstd_and_uncompressed_layers(tmp_path, env, proxy):
    result = berth(["import", f"docker://{proxy.host}#test/zstd:v1"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    root = unsquash(tmp_path / "test+zstd+v1.sqsh", tmp_path / "root")
    assert (root / "etc/added").read_text() == "added\n"
    assert not (root / "etc/old").exists()


def test_index_picks_host_arch_or_arch_option(tmp_path, env, proxy):
    uri = f"docker://{proxy.host}#test/multi:v1"
    assert berth(["import", "-o", "host.sqsh", uri], env, tmp_path).returncode == 0
    assert (unsquash(tmp_path / "host.sqsh", tmp_path / "h") / "etc/os-release").exists()
    result = berth(["import", "-a", f"{OTHER_ARCH}/v8", "-o", "other.sqsh", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(unsquash(tmp_path / "other.sqsh", tmp_path / "o"))) == \
        ["etc", "other"]
    result = berth(["import", "-a", "s390x", uri], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"berth: error: {proxy.host}/test/multi:v1 has no image for architecture s390x; "
        f"available: {', '.join(sorted([HOST_ARCH, OTHER_ARCH + '/v8']))} "
        "(choose one with --arch)")


def test_reuse_keeps_the_latest_image_of_a_multi_arch_uri_per_platform(tmp_path, env, proxy):
    """Nodes of two architectures sharing one cache (or store): --reuse on
    each takes its own platform's image, whichever imported last."""
    uri = f"docker://{proxy.host}#test/multi:v1"

    def reuse(*arch):
        result = berth(["import", "--cache-only", "--reuse", *arch, uri], env, tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    host = reuse()
    other = reuse("-a", f"{OTHER_ARCH}/v8")
    assert other != host
    assert reuse() == host
    assert reuse("-a", f"{OTHER_ARCH}/v8") == other
    assert "other" in os.listdir(unsquash(other, tmp_path / "o"))


def test_existing_output_is_kept_unless_forced(tmp_path, env, proxy):
    out = tmp_path / "test+app+v1.sqsh"
    out.write_text("precious")
    uri = f"docker://{proxy.host}#test/app:v1"
    result = berth(["import", uri], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"berth: error: {out} already exists; remove it or set "
                             "ENROOT_FORCE_OVERRIDE=yes\n")
    assert out.read_text() == "precious"
    assert proxy.requests == []  # refused before any network traffic
    forced = berth(["import", uri], dict(env, ENROOT_FORCE_OVERRIDE="yes"), tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert out.read_bytes().startswith(b"hsqs")


@pytest.mark.parametrize("uri, message", [
    ("foo.sqsh", "berth: error: 'foo.sqsh' is not a registry reference; expected "
                 "docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]"),
    ("docker://Bad/Name", "berth: error: invalid image reference 'docker://Bad/Name': image "
                          "name 'Bad/Name' is not valid"),
    # a newline or another control character is shown escaped: the error stays one line
    ("docker://ubuntu\nevil:1", "berth: error: invalid image reference 'docker://ubuntu\\nevil:1'"),
    ("docker://ubu\x1b[2Jntu", "berth: error: invalid image reference 'docker://ubu\\x1b[2Jntu'"),
])
def test_bad_reference(tmp_path, env, uri, message):
    result = berth(["import", uri], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert_nothing_left(tmp_path)


def test_unusable_paths_are_named(tmp_path, env, proxy):
    uri = f"docker://{proxy.host}#test/app:v1"
    (tmp_path / "adir").mkdir()
    result = berth(["import", "-o", "adir", uri], env, tmp_path)
    assert result.stderr == f"berth: error: output {tmp_path / 'adir'} is a directory; " \
                            "name the image file\n"
    result = berth(["import", "-o", "no/such/x.sqsh", uri], env, tmp_path)
    assert result.stderr == f"berth: error: output directory {tmp_path / 'no/such'} does " \
                            "not exist or is not writable\n"
    (tmp_path / "afile").write_text("")
    result = berth(["import", uri], dict(env, ENROOT_CACHE_PATH=str(tmp_path / "afile")),
                   tmp_path)
    assert result.stderr.startswith(f"berth: error: ENROOT_CACHE_PATH {tmp_path / 'afile'}: "
                                    "is not a directory")
    assert result.stderr.count("\n") == 1
    assert_nothing_left(tmp_path)


def test_unknown_image_or_tag(tmp_path, env, proxy):
    for image in ("test/app:nope", "test/none:v1"):
        result = berth(["import", f"docker://{proxy.host}#{image}"], env, tmp_path)
        assert result.returncode == 1
        assert result.stderr == f"berth: error: image not found: {proxy.host}/{image}\n"
    assert_nothing_left(tmp_path)


def test_plain_http_needs_allow_http(tmp_path, env, registry):
    result = berth(["import", f"docker://{registry.host}#test/app:v1"],
                   dict(env, ENROOT_ALLOW_HTTP="no"), tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: error: registry {registry.host} does not speak "
                                    "HTTPS (")
    assert result.stderr.endswith("set ENROOT_ALLOW_HTTP=yes in enroot.conf\n")
    assert_nothing_left(tmp_path)


def write_credentials(env, text, mode=0o600):
    config = Path(env["ENROOT_CONFIG_PATH"])
    config.mkdir(exist_ok=True)
    path = config / ".credentials"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("scheme", ["bearer", "basic"])
def test_registry_credentials(tmp_path, env, registry, scheme):
    proxy = Proxy(registry.url, auth=scheme, login="alice", password="secret")
    try:
        uri = f"docker://{proxy.host}#test/app:v1"
        result = berth(["import", uri], env, tmp_path)
        assert result.returncode == 1
        assert result.stderr == (
            f"berth: error: registry {proxy.host} refused access to test/app (401 "
            f"Unauthorized) with no credentials for {proxy.host} in "
            f"{env['ENROOT_CONFIG_PATH']}/.credentials (not found)\n")
        path = write_credentials(env, "machine 127.0.0.1 login alice password wrong\n")
        result = berth(["import", uri], env, tmp_path)
        assert result.returncode == 1
        assert result.stderr == (
            f"berth: error: registry {proxy.host} refused access to test/app (401 "
            f"Unauthorized) with the credentials in {path}\n")
        write_credentials(env, f"machine {proxy.host} login alice password secret\n")
        result = berth(["import", uri], env, tmp_path)
        assert result.returncode == 0, result.stderr
    finally:
        proxy.stop()
    assert_nothing_left(tmp_path, keep=["test+app+v1.sqsh"])


def test_user_selects_the_entry_or_is_asked_for_a_password(tmp_path, env, registry):
    proxy = Proxy(registry.url, auth="bearer", login="bob", password="hunter2")
    try:
        path = write_credentials(env, f"machine {proxy.host} login alice password secret\n")
        uri = f"docker://bob@{proxy.host}#test/app:v1"
        result = berth(["import", uri], env, tmp_path)  # no terminal to ask on
        assert result.stderr == (
            f"berth: error: registry {proxy.host} refused access to test/app (401 "
            f"Unauthorized) with no credentials for bob@{proxy.host} in {path}\n")
        pid, terminal = pty.fork()
        if pid == 0:  # the child: the pseudo-terminal is its controlling terminal
            os.chdir(tmp_path)
            os.execve(sys.executable, [sys.executable, "-m", "berth.cli", "import", uri], env)
        shown = b""
        while b"Password for bob@" not in shown:
            shown += os.read(terminal, 1024)
        os.write(terminal, b"hunter2\n")
        with contextlib.suppress(OSError):
            while chunk := os.read(terminal, 1024):
                shown += chunk
        assert os.waitpid(pid, 0)[1] == 0, shown
        assert (tmp_path / "test+app+v1.sqsh").exists()
        assert b"hunter2" not in shown  # not echoed
    finally:
        proxy.stop()


def test_expired_token_is_renewed(tmp_path, env, registry):
    proxy = Proxy(registry.url, auth="bearer", login="alice", password="secret")
    proxy.token_uses = 3  # expires during the layer downloads
    try:
        write_credentials(env, f"machine {proxy.host} login alice password secret\n")
        result = berth(["import", f"docker://{proxy.host}#test/app:v1"],
                       dict(env, ENROOT_MAX_CONNECTIONS="1"), tmp_path)
        assert result.returncode == 0, result.stderr
        assert len(proxy.tokens) >= 2
    finally:
        proxy.stop()


def test_credentials_readable_by_others_are_refused(tmp_path, env, proxy):
    path = write_credentials(env, f"machine {proxy.host} login a password b\n", mode=0o644)
    result = berth(["import", f"docker://{proxy.host}#test/app:v1"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"berth: error: {path}: mode 0644 lets others read the registry "
                             "passwords; chmod 0600 it\n")
    assert proxy.requests == []


def test_malformed_credentials_name_file_and_line(tmp_path, env, proxy):
    path = write_credentials(env, f"machine {proxy.host} login a password b\nbogus x\n")
    result = berth(["import", f"docker://{proxy.host}#test/app:v1"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {path}:2: bad follower token 'bogus'\n"
    assert proxy.requests == []


def test_manifest_digest_mismatch(tmp_path, env, proxy, registry):
    path = f"/v2/test/app/manifests/{registry.app_digest}"
    proxy.tamper[path] = b'{"schemaVersion": 2, "layers": []}'
    result = berth(["import", f"docker://{proxy.host}#test/app@{registry.app_digest}"],
                   env, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"berth: error: manifest digest mismatch for {proxy.host}/test/app@"
        f"{registry.app_digest}: expected {registry.app_digest}, got sha256:")
    assert_nothing_left(tmp_path)


def test_malformed_manifest(tmp_path, env, proxy, registry):
    body = b'{"schemaVersion": 2, "mediaType": "%s", "layers": "no"}' % DOCKER_MANIFEST.encode()
    proxy.tamper["/v2/test/app/manifests/v2"] = body
    result = berth(["import", f"docker://{proxy.host}#test/app:v2"], env, tmp_path)
    assert result.stderr == ("berth: error: the manifest or image config of "
                             f"{proxy.host}/test/app:v2 is malformed\n")
    assert_nothing_left(tmp_path)


def test_layer_digest_mismatch_leaves_no_blob(tmp_path, env, proxy, registry):
    bad = layer_digests(registry, "test/app")[1]
    proxy.tamper[f"/v2/test/app/blobs/{bad}"] = gzipped(layer_tar(("file", "evil", b"")))
    result = berth(["import", f"docker://{proxy.host}#test/app:v1"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: error: layer digest mismatch: expected {bad}, got")
    assert not (tmp_path / "cache/blobs/sha256" / bad[7:]).exists()
    assert_nothing_left(tmp_path)


def test_broken_transfer_leaves_no_partial_layer_and_rerun_works(tmp_path, env, proxy,
                                                                 registry):
    broken = layer_digests(registry, "test/big")[0]
    proxy.cut.add(broken)
    uri = f"docker://{proxy.host}#test/big:v1"
    result = berth(["import", uri], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: error: download of {broken} from {proxy.host} "
                                    "failed: ")
    assert not (tmp_path / "cache/blobs/sha256" / broken[7:]).exists()
    assert_nothing_left(tmp_path)
    proxy.cut.clear()
    result = berth(["import", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr


def test_sigterm_cleans_up(tmp_path, env, proxy, registry):
    # The layer held long enough that the import is still downloading it
    # when the signal comes, however long a loaded machine keeps this test
    # from sending it.
    proxy.blob_delay, proxy.delayed = 20, set(layer_digests(registry, "test/big"))
    process = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "import", f"docker://{proxy.host}#test/big:v1"],
        env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    blobs = tmp_path / "cache/blobs/sha256"
    while not (blobs.exists() and list(blobs.iterdir())):  # the layer download began
        time.sleep(0.05)
    process.terminate()
    assert process.wait(30) == 1
    assert process.stderr.read() == "berth: error: import interrupted by SIGTERM\n"
    # A layer that finished before the signal may stay (a re-run reuses it),
    # but only whole and verified: no partial or unverified blob.
    for blob in blobs.iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert_nothing_left(tmp_path)


def test_retries_recover_a_broken_transfer(tmp_path, env, proxy, registry):
    broken = layer_digests(registry, "test/big")[0]
    proxy.cut_once.add(broken)
    result = berth(["import", f"docker://{proxy.host}#test/big:v1"],
                   dict(env, ENROOT_TRANSFER_RETRIES="1"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(blob_downloads(proxy, [broken])) == 2


def test_transfer_timeout(tmp_path, env, proxy):
    proxy.blob_delay = 3
    result = berth(["import", f"docker://{proxy.host}#test/app:v1"],
                   dict(env, ENROOT_TRANSFER_TIMEOUT="1"), tmp_path)
    assert result.returncode == 1
    assert "timed out" in result.stderr and result.stderr.count("\n") == 1
    assert_nothing_left(tmp_path)


def test_not_enough_temporary_space_fails_early_where_the_layers_are_unpacked(
        tmp_path, env, proxy):
    """An image packed from its layers' streams needs no temporary space;
    one whose layers are applied in order needs room for them, and fails
    before it starts without."""
    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "berth-test", str(small)],
                           capture_output=True, check=False)
    if mount.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        env = dict(env, ENROOT_TEMP_PATH=str(small))
        packed = berth(["import", f"docker://{proxy.host}#test/big:v1"], env, tmp_path)
        assert packed.returncode == 0, packed.stderr
        assert os.listdir(small) == []
        result = berth(["import", f"docker://{proxy.host}#test/big-through-link:v1"], env,
                       tmp_path)
        assert result.returncode == 1
        assert result.stderr.startswith(
            f"berth: error: not enough space in {small} for the unpacked image: ")
        assert "bytes free, at least" in result.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert [path.name for path in tmp_path.glob("*.sqsh*")] == ["test+big+v1.sqsh"]


def test_import_as_an_unprivileged_user(proxy):
    if os.getuid() != 0:
        pytest.skip("needs root to switch to the user nobody")
    probe = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c",
                            "import requests, tqdm"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"{sys.executable} with requests and tqdm is not usable by nobody")
    home = Path(tempfile.mkdtemp(prefix="berth-import-user-"))
    try:
        home.chmod(0o755)
        shutil.chown(home, "nobody")
        env = berth_env(home)
        shutil.chown(home / "temp", "nobody")
        result = berth(["import", f"docker://{proxy.host}#test/app:v1"], env, home,
                       user="nobody")
        assert result.returncode == 0, result.stderr
        image = home / "test+app+v1.sqsh"
        assert image.stat().st_uid == home.stat().st_uid
        # Stored as root's, not as nobody's: the image is the same whoever
        # imported it, and a container maps root, not the importer.
        owners = subprocess.run(["unsquashfs", "-lln", str(image)], capture_output=True,
                                text=True, check=True).stdout.splitlines()
        assert {line.split()[1] for line in owners if line[:1] in "dl-"} == {"0/0"}
        root = unsquash(image, home / "root")
        assert (root / "etc/added").read_text() == "added\n"
        assert not (root / "etc/old").exists()
        assert (home / "cache").stat().st_uid == home.stat().st_uid
    finally:
        shutil.rmtree(home)
