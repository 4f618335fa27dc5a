"""`berth start docker://URI`: the image cache's squashfs of a registry
image, found or made as `berth import --cache-only` does, started in one
process (the SPANK plugin's one Python start per node and step instead of
an import and a start). Real namespaces and squashfuse as in
test_container.py (its fixtures: the user `berthtest` when run as root), a
real registry behind the counting proxy as in test_import.py.
"""

import io
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from container_fixture import berth_pid, build_root
from registry_fixture import Registry, free_port, gzipped

pytestmark = pytest.mark.skipif(not shutil.which("docker-registry"),
                                reason="needs docker-registry (Debian package docker-registry)")

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
OS_RELEASE = "ID=berth-busybox\n"


def busybox_layer():
    """One gzipped layer: a busybox root (test_container's) with an /etc/os-release."""
    top = Path(tempfile.mkdtemp(prefix="bstart-layer-"))
    try:
        root = top / "root"
        build_root(root, rc=False)
        (root / "etc/os-release").write_text(OS_RELEASE)
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(root.rglob("*")):
                info = tar.gettarinfo(path, arcname=str(path.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        return gzipped(out.getvalue())
    finally:
        shutil.rmtree(top)


def push_busybox(registry, repo="test/busybox", tag="v1"):
    """A runnable image (busybox, /bin/sh its command); its manifest digest."""
    config = {"architecture": HOST_ARCH, "os": "linux",
              "config": {"Env": ["PATH=/usr/local/bin:/bin", "FROM_IMAGE=yes"],
                         "Cmd": ["/bin/sh"]}}
    return registry.push_image(repo, tag, [busybox_layer()], config)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.busybox_digest = push_busybox(reg)
    yield reg
    reg.stop()


@pytest.fixture
def pulling(berth):
    """test_container's `berth`, with an image cache and temporary directory
    of its own and plain-HTTP registries allowed."""
    for name in ("cache", "temp"):
        (berth.base / name).mkdir()
    berth.chown(berth.base / "cache", berth.base / "temp")
    berth.env.update({
        "ENROOT_CACHE_PATH": str(berth.base / "cache"),
        "ENROOT_TEMP_PATH": str(berth.base / "temp"),
        "ENROOT_ALLOW_HTTP": "yes", "ENROOT_SQUASH_OPTIONS": "-comp gzip",
        "ENROOT_MAX_PROCESSORS": "1",
    })
    return berth


def uri_of(proxy, image="test/busybox:v1"):
    return f"docker://{proxy.host}#{image}"


def detached(berth, *args):
    """`berth start --detach ARGS`: the process, the digest line and the pid line."""
    process = subprocess.Popen(berth.command("start", "--detach", *args), env=berth.env,
                               cwd=berth.base, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    digest, pid = process.stdout.readline(), process.stdout.readline()
    if not pid.strip().isdigit():
        process.kill()
        raise AssertionError((digest, pid, process.stderr.read()))
    return process, digest, int(pid)


def stop(process):
    process.stdin.close()  # end of stdin stops the container
    assert process.wait(timeout=10) == 0, process.stderr.read()


def cache_entries(berth):
    return sorted((berth.base / "cache/images").glob("*.sqsh"))


def test_start_detach_prints_the_digest_then_the_pid(pulling, proxy, registry):
    berth = pulling
    process, digest, pid = detached(berth, "-e", "FROM_CLI=yes", uri_of(proxy))
    try:
        assert digest == f"{registry.busybox_digest}\n"
        assert "/v2/test/busybox/manifests/v1" in proxy.requests
        out = berth("exec", pid, "sh", "-c", "cat /etc/os-release; echo $FROM_IMAGE $FROM_CLI")
        assert out.returncode == 0 and out.stdout == f"{OS_RELEASE}yes yes\n", out.stderr
        [entry] = cache_entries(berth)
        # the start's runtime dir (and its name in berth list) is the entry's file name
        assert [p.name.rsplit(".", 1)[0] for p in (berth.base / "run").iterdir()] == \
            [entry.name]
    finally:
        stop(process)
    assert not os.path.exists(f"/proc/{pid}")
    assert berth.leftovers() == []

    # What `import --cache-only --digest` prints: the same entry, the same digest.
    imported = berth("--quiet", "import", "--cache-only", "--digest", uri_of(proxy))
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == f"{entry}\n{digest}"
    assert cache_entries(berth) == [entry]


def test_start_with_reuse_asks_no_registry(pulling, proxy, registry):
    berth = pulling
    first = berth("start", "--reuse", uri_of(proxy), "cat", "/etc/os-release")
    # without --detach stdout is the command's alone
    assert first.returncode == 0 and first.stdout == OS_RELEASE, first.stderr
    assert "/v2/test/busybox/manifests/v1" in proxy.requests
    [entry] = cache_entries(berth)
    proxy.requests.clear()

    process, digest, pid = detached(berth, "--reuse", uri_of(proxy))
    try:
        # the image was there before: said on the digest line, for the plugin's message
        assert digest == f"{registry.busybox_digest} cached\n"
        assert proxy.requests == []  # not even the manifest
        assert berth("exec", pid, "cat", "/etc/os-release").stdout == OS_RELEASE
    finally:
        stop(process)
    assert cache_entries(berth) == [entry]
    assert berth.leftovers() == []

    # without --reuse the registry is asked (a moved tag shows), nothing is downloaded
    again = berth("--quiet", "start", uri_of(proxy), "true")
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    assert proxy.requests == ["/v2/test/busybox/manifests/v1"]


def answer(line):
    """{key: value} of a --porcelain line (berth/porcelain.py), its values decoded."""
    assert line.endswith("\n") and line.count("\n") == 1, line
    return {key: unquote(value) for key, _, value in
            (pair.partition("=") for pair in line[:-1].split(" "))}


def test_porcelain_answers_the_plugin_in_key_value_lines(pulling, proxy, registry):
    """--porcelain: what the SPANK plugin reads (spank/answer.c), KEY=VALUE
    pairs: a detached start's digest and cached, then its pid; import
    --cache-only's squashfs, digest and cached. Only where there is such
    an answer."""
    berth = pulling
    berth.fails("start", "--porcelain", uri_of(proxy), "true", needle="--porcelain: only with "
                "--detach", stdin=subprocess.DEVNULL)
    berth.fails("import", "--porcelain", uri_of(proxy), needle="--porcelain: only with "
                "--cache-only")
    process = subprocess.Popen(berth.command("start", "--detach", "--porcelain", uri_of(proxy)),
                               env=berth.env, cwd=berth.base, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    image, ready = process.stdout.readline(), process.stdout.readline()
    try:
        assert answer(image) == {"digest": registry.busybox_digest, "cached": "no"}, \
            process.stderr.read()
        pid = answer(ready)["pid"]
        assert list(answer(ready)) == ["pid"] and pid.isdigit()
        assert berth("exec", pid, "cat", "/etc/os-release").stdout == OS_RELEASE
    finally:
        stop(process)
    [entry] = cache_entries(berth)
    imported = berth("--quiet", "import", "--cache-only", "--porcelain", "--reuse",
                     uri_of(proxy))
    assert imported.returncode == 0, imported.stderr
    assert answer(imported.stdout) == {"squashfs": str(entry),
                                       "digest": registry.busybox_digest, "cached": "yes"}


def test_an_unreachable_registry_fails_before_anything_starts(pulling):
    berth = pulling
    uri = f"docker://127.0.0.1:{free_port()}#test/busybox:v1"
    line = berth.fails("start", "--detach", uri, needle="Connection refused",
                       stdin=subprocess.DEVNULL)
    # the reason `import --cache-only` gives, word for word
    imported = berth("import", "--cache-only", uri)
    assert imported.returncode == 1 and imported.stderr == f"{line}\n"
    result = berth("start", "--detach", "--reuse", uri, stdin=subprocess.DEVNULL)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == imported.stderr
    assert list((berth.base / "run").iterdir()) == []
    assert berth.leftovers() == []


def test_a_blocked_reference_is_refused_before_any_request(pulling, proxy):
    berth = pulling
    berth.write("sys/registries.conf",
                f'[[registry]]\nprefix = "{proxy.host}/test/busybox"\nblocked = true\n')
    for extra in ([], ["--reuse"]):
        result = berth("start", "--detach", *extra, uri_of(proxy), stdin=subprocess.DEVNULL)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert f"is blocked by the rule for '{proxy.host}/test/busybox'" in result.stderr
    assert proxy.requests == []
    assert berth.leftovers() == []


@pytest.mark.parametrize("target", ["image", "name"])
def test_reuse_only_with_a_registry_target(pulling, images, target):
    berth = pulling
    if target == "name":
        berth.ok("create", images / "app.sqsh")
    container = images / "app.sqsh" if target == "image" else "app"
    line = berth.fails("start", "--reuse", container, "true", needle="--reuse",
                       stdin=subprocess.DEVNULL)
    assert "docker://" in line


def test_sigterm_during_the_pull_leaves_nothing(pulling, proxy):
    berth = pulling
    proxy.blob_delay = 2
    process = subprocess.Popen(berth.command("start", "--detach", uri_of(proxy)),
                               env=berth.env, cwd=berth.base, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not proxy.blob_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.blob_requests(), process.stderr.read()
        os.kill(berth_pid(process), signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        proxy.blob_delay = 0
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1 and out == ""
    assert err == "berth: error: import interrupted by SIGTERM\n"
    assert berth.leftovers() == []
    assert cache_entries(berth) == []
    blobs = berth.base / "cache/blobs/sha256"
    assert not blobs.exists() or [p.name for p in blobs.iterdir()
                                  if p.name.startswith(".")] == []
    assert list((berth.base / "temp").iterdir()) == []


def test_batch_takes_no_registry_target(pulling, proxy):
    """Only `start` takes docker://; a batch file's ROOTFS is a name or a file."""
    berth = pulling
    conf = berth.write("batch.conf", f"#ENROOT_ROOTFS={uri_of(proxy)}\n")
    result = berth("batch", conf, "true", stdin=subprocess.DEVNULL)
    assert result.returncode == 1 and "No such file" in result.stderr
    assert proxy.requests == []
