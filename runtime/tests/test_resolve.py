"""`berth import --resolve`: a tag resolved to the digest it names now, in
one manifest request, printed as a pinned URI that imports that image (what
the SPANK plugin does once per job at submission). A real registry behind
counting proxies; registries.conf mirrors and short names."""

import http.server
import shutil
import sys
import threading
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import Proxy, Registry, berth, free_port, gzipped, layer_tar, listing

from berth import porcelain

pytestmark = pytest.mark.skipif(not shutil.which("docker-registry"),
                                reason="needs docker-registry (Debian package docker-registry)")

BASE = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=berth\n")))
TOP = gzipped(layer_tar(("file", "etc/added", b"added\n")))
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.app_digest = reg.push_image("test/app", "v1", [BASE, TOP])
    amd64 = reg.push_image("test/multi", "amd64", [BASE],
                           config={"architecture": "amd64", "os": "linux", "config": {}})
    arm64 = reg.push_image("test/multi", "arm64", [BASE, TOP],
                           config={"architecture": "arm64", "os": "linux", "config": {}})
    reg.multi_digest = reg.push_index("test/multi", "v1",
                                      {("amd64", ""): amd64, ("arm64", ""): arm64})
    yield reg
    reg.stop()


def resolve(uri, env, cwd, *extra):
    return berth([*extra, "import", "--resolve", uri], env, cwd)


def resolved(uri, env, cwd):
    result = resolve(uri, env, cwd)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1, result.stdout
    return result.stdout.strip()


def imported_digest(uri, env, cwd):
    """The digest `berth import --cache-only --digest` says the image was pulled by."""
    result = berth(["-q", "import", "--cache-only", "--digest", uri], env, cwd)
    assert result.returncode == 0, result.stderr
    path, digest = result.stdout.splitlines()
    return path, digest


def conf(env, text):
    sysconf = Path(env["ENROOT_SYSCONF_PATH"])
    sysconf.mkdir(parents=True, exist_ok=True)
    (sysconf / "registries.conf").write_text(text)


def test_one_manifest_request_no_blob_no_cache(tmp_path, env, proxy, registry):
    uri = f"docker://{proxy.host}#test/app:v1"
    pinned = resolved(uri, env, tmp_path)
    assert pinned == f"docker://{proxy.host}#test/app@{registry.app_digest}"
    assert proxy.requests == ["/v2/test/app/manifests/v1"]
    assert proxy.blob_requests() == []
    assert not (tmp_path / "cache").exists() and list(tmp_path.iterdir()) == [tmp_path / "temp"]


def test_the_pinned_uri_imports_the_same_image(tmp_path, env, proxy, registry):
    uri = f"docker://{proxy.host}#test/app:v1"
    pinned = resolved(uri, env, tmp_path)
    by_tag, by_pin = imported_digest(uri, env, tmp_path), imported_digest(pinned, env, tmp_path)
    assert by_tag[1] == by_pin[1] == registry.app_digest
    # the same files (image.json records each its own source URI)
    assert listing(by_tag[0]) == listing(by_pin[0]) and "/etc/added" in listing(by_pin[0])


def test_a_moved_tag_resolves_to_its_new_digest(tmp_path, env, proxy, registry):
    registry.push_image("test/moving", "v1", [BASE])
    uri = f"docker://{proxy.host}#test/moving:v1"
    before = resolved(uri, env, tmp_path)
    moved_to = registry.push_image("test/moving", "v1", [BASE, TOP])
    after = resolved(uri, env, tmp_path)
    assert after != before and after.endswith(f"@{moved_to}")
    # each pinned URI keeps naming its own image, whatever the tag does
    assert imported_digest(before, env, tmp_path)[1] == before.rpartition("@")[2]
    assert imported_digest(after, env, tmp_path)[1] == moved_to


def test_a_multi_arch_image_resolves_to_its_index(tmp_path, env, proxy, registry):
    uri = f"docker://{proxy.host}#test/multi:v1"
    # the index's digest, whatever the platform: the nodes pick theirs
    for arch in ("amd64", "arm64"):
        proxy.requests.clear()
        result = berth(["import", "--resolve", "--arch", arch, uri], env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"docker://{proxy.host}#test/multi@{registry.multi_digest}\n"
        assert proxy.requests == ["/v2/test/multi/manifests/v1"]
    pinned = result.stdout.strip()
    assert imported_digest(pinned, env, tmp_path)[1] == registry.multi_digest


def test_a_pinned_uri_is_its_own_answer(tmp_path, env, proxy):
    uri = f"docker://{proxy.host}#test/app@{DIGEST}"
    assert resolved(uri, env, tmp_path) == uri
    assert proxy.requests == []


def test_a_short_name_resolves_through_the_search_registries(tmp_path, env, proxy, registry):
    dead = f"127.0.0.1:{free_port()}"
    conf(env, f'unqualified-search-registries = ["{dead}", "{proxy.host}"]\n')
    result = resolve("docker://test/app:v1", env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"docker://{proxy.host}#test/app@{registry.app_digest}\n"
    assert f"berth: {dead}/test/app:v1 failed" in result.stderr
    assert "berth: resolving " in result.stderr


def test_the_pinned_uri_names_the_rules_registry_not_the_mirror(tmp_path, env, registry):
    registry.push_image("mirrored/test/app", "v1", [BASE, TOP])
    origin, mirror = Proxy(registry.url), Proxy(registry.url)
    try:
        conf(env, f'[[registry]]\nprefix = "{origin.host}/test"\n'
                  f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored/test"\n')
        pinned = resolved(f"docker://{origin.host}#test/app:v1", env, tmp_path)
        assert pinned == f"docker://{origin.host}#test/app@{registry.app_digest}"
        assert origin.requests == ["HEAD /v2/test/app/manifests/v1"]  # the tag's check
        assert mirror.requests == ["/v2/mirrored/test/app/manifests/v1"]
        # and the node's import of it goes through the same rule: the mirror again
        assert imported_digest(pinned, env, tmp_path)[1] == registry.app_digest
        assert origin.requests == ["HEAD /v2/test/app/manifests/v1"]  # a digest: no check
        assert f"/v2/mirrored/test/app/manifests/{registry.app_digest}" in mirror.requests
    finally:
        origin.stop()
        mirror.stop()


def alices_credentials(env, host):
    """alice's login for `host` in the caller's .credentials (0600); its path."""
    credentials = Path(env["ENROOT_CONFIG_PATH"]) / ".credentials"
    credentials.parent.mkdir(parents=True, exist_ok=True)
    credentials.write_text(f"machine {host} login alice password secret\n")
    credentials.chmod(0o600)
    return credentials


def test_user_and_credentials_as_for_an_import(tmp_path, env, registry):
    guarded = Proxy(registry.url, auth="basic", login="alice", password="secret")
    try:
        credentials = alices_credentials(env, guarded.host)
        pinned = resolved(f"docker://alice@{guarded.host}#test/app:v1", env, tmp_path)
        assert pinned == f"docker://alice@{guarded.host}#test/app@{registry.app_digest}"
        credentials.unlink()
        result = resolve(f"docker://{guarded.host}#test/app:v1", env, tmp_path)
        assert result.returncode == porcelain.PERMANENT and result.stdout == ""
        assert result.stderr.count("\n") == 1 and "401" in result.stderr
    finally:
        guarded.stop()


def test_a_bearer_token_from_the_token_service(tmp_path, env, registry):
    guarded = Proxy(registry.url, auth="bearer", login="alice", password="secret")
    try:
        credentials = alices_credentials(env, guarded.host)
        pinned = resolved(f"docker://{guarded.host}#test/app:v1", env, tmp_path)
        assert pinned == f"docker://{guarded.host}#test/app@{registry.app_digest}"
        assert guarded.requests == [
            "/v2/test/app/manifests/v1", "/token?scope=repository%3Atest%2Fapp%3Apull&service=test",
            "/v2/test/app/manifests/v1"]
        credentials.unlink()  # the token service then refuses: one line
        result = resolve(f"docker://{guarded.host}#test/app:v1", env, tmp_path)
        assert result.returncode == porcelain.PERMANENT and result.stderr.count("\n") == 1
        assert f"registry {guarded.host} refused access to test/app (401 Unauthorized)" in \
            result.stderr
    finally:
        guarded.stop()


class ForwardProxy:
    """An HTTP proxy on 127.0.0.1 (absolute URLs in, requests out), recording each URL."""

    def __init__(self):
        self.urls = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.urls.append(self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() == "accept"}
                upstream = requests.get(self.path, headers=headers, timeout=10)
                self.send_response(upstream.status_code)
                for key in ("Content-Type", "Docker-Content-Digest"):
                    if key in upstream.headers:
                        self.send_header(key, upstream.headers[key])
                self.send_header("Content-Length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy"])
def test_a_proxy_in_the_environment_is_honoured(tmp_path, env, proxy, registry, name):
    """With a proxy set, a resolve goes through requests, which honours it and NO_PROXY."""
    forward = ForwardProxy()
    try:
        uri = f"docker://{proxy.host}#test/app:v1"
        env = {k: v for k, v in env.items() if not k.lower().endswith("_proxy")}
        pinned = resolved(uri, dict(env, **{name: forward.url}), tmp_path)
        assert pinned == f"docker://{proxy.host}#test/app@{registry.app_digest}"
        assert forward.urls == [f"http://{proxy.host}/v2/test/app/manifests/v1"]
        resolved(uri, dict(env, **{name: forward.url, "NO_PROXY": "127.0.0.1"}), tmp_path)
        assert len(forward.urls) == 1 and len(proxy.requests) == 2
    finally:
        forward.stop()


def test_a_proxy_in_enroot_conf_is_honoured_as_enroot_honours_it(tmp_path, env, proxy, registry):
    """enroot.conf may set http_proxy, https_proxy, all_proxy, no_proxy,
    SSL_CERT_FILE and SSL_CERT_DIR, as enroot's does for curl; the
    environment's value wins over the file's."""
    forward, other = ForwardProxy(), ForwardProxy()
    try:
        uri = f"docker://{proxy.host}#test/app:v1"
        env = {k: v for k, v in env.items() if not k.lower().endswith("_proxy")}
        sysconf = Path(env["ENROOT_SYSCONF_PATH"])
        sysconf.mkdir(parents=True, exist_ok=True)
        (sysconf / "enroot.conf").write_text(
            f"http_proxy {forward.url}\nSSL_CERT_DIR /etc/ssl/certs\n")
        assert resolved(uri, env, tmp_path) == f"docker://{proxy.host}#test/app@{registry.app_digest}"
        assert forward.urls == [f"http://{proxy.host}/v2/test/app/manifests/v1"]
        resolved(uri, dict(env, http_proxy=other.url), tmp_path)
        assert len(forward.urls) == 1 and len(other.urls) == 1
        (sysconf / "enroot.conf").write_text(f"http_proxy {forward.url}\nno_proxy 127.0.0.1\n")
        resolved(uri, env, tmp_path)
        assert len(forward.urls) == 1 and len(proxy.requests) == 3
    finally:
        forward.stop()
        other.stop()


@pytest.mark.parametrize("where, key, value", [
    ("enroot.conf", "https_proxy", "not a url"),
    ("enroot.conf", "http_proxy", "http://proxy.example:99999"),
    ("environment", "HTTPS_PROXY", "ftp://proxy.example:21"),
    ("environment", "http_proxy", "http://proxy.example:3128\nX-Injected: 1"),
])
def test_a_malformed_proxy_is_one_line_naming_its_variable(tmp_path, env, proxy, where, key,
                                                            value):
    """requests' words would name the registry, not the setting that is wrong."""
    env = {k: v for k, v in env.items() if not k.lower().endswith("_proxy")}
    if where == "enroot.conf":
        sysconf = Path(env["ENROOT_SYSCONF_PATH"])
        sysconf.mkdir(parents=True, exist_ok=True)
        (sysconf / "enroot.conf").write_text(f"{key} {value}\n")
    else:
        env[key] = value
    result = resolve(f"docker://{proxy.host}#test/app:v1", env, tmp_path)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"berth: error: {key}: ") and "is not a proxy URL" in \
        result.stderr
    assert proxy.requests == []


# (the exit status: the plugin refuses the job on porcelain.PERMANENT)
@pytest.mark.parametrize("uri, message, status", [
    ("docker://{host}#test/absent:v1", "image not found: {host}/test/absent:v1",
     porcelain.PERMANENT),
    ("docker://{dead}#test/app:v1", "Connection refused", 1),
    ("docker-archive:/tmp/image.tar", "--resolve: 'docker-archive:/tmp/image.tar' is an "
                                      "archive", 1),
    ("docker://{host}#Test/app:v1", "invalid image reference", 1),
])
def test_errors_are_one_line(tmp_path, env, proxy, uri, message, status):
    values = {"host": proxy.host, "dead": f"127.0.0.1:{free_port()}"}
    result = resolve(uri.format(**values), env, tmp_path)
    assert result.returncode == status and result.stdout == ""
    assert result.stderr.startswith("berth: error: ") and result.stderr.count("\n") == 1
    assert message.format(**values) in result.stderr
    assert proxy.blob_requests() == [] and not (tmp_path / "cache").exists()


def test_blocked_is_refused_before_any_request(tmp_path, env, proxy):
    conf(env, f'[[registry]]\nprefix = "{proxy.host}/test"\nblocked = true\n')
    result = resolve(f"docker://{proxy.host}#test/app:v1", env, tmp_path)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "is blocked by the rule" in result.stderr and proxy.requests == []


@pytest.mark.parametrize("extra", [["--reuse"], ["--dry-run"], ["--cache-only"], ["-o", "x"]])
def test_resolve_takes_no_other_mode(tmp_path, env, proxy, extra):
    result = berth(["import", "--resolve", *extra, f"docker://{proxy.host}#test/app:v1"], env,
                   tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert "--resolve" in result.stderr and proxy.requests == []
