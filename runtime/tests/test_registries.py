"""registries.conf: parsing the admin's mirror and rewrite rules, resolving
references through them, and `berth import` following them against real
registries on 127.0.0.1 (mirrors tried first, falling through, blocked,
insecure, credentials of a mirror, one cache entry whichever answered).

The files here are written for these tests in the shapes sites use with
podman, CRI-O and skopeo (containers-registries.conf v2)."""

import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import Proxy, Registry, berth, free_port, gzipped, layer_tar

from berth.errors import BerthError
from berth.image import reference, registries

DIGEST = "sha256:" + "ab" * 32

SITE = """\
# /etc/enroot/registries.conf of a GPU cluster whose nodes reach no public registry
unqualified-search-registries = ["registry.site.example", "docker.io"]

[[registry]]
prefix = "docker.io"
location = "docker.io"

  [[registry.mirror]]
  location = "harbor.site.example/dockerhub"

  [[registry.mirror]]
  # the old cache only holds images pulled by digest
  location = "10.1.2.3:5000/hub"
  insecure = true
  pull-from-mirror = "digest-only"

[[registry]]
location = "nvcr.io"
mirror = [{ location = "harbor.site.example/nvcr" }]

[[registry]]
prefix = "nvcr.io/nvidia/private"
blocked = true

[[registry]]
prefix = "*.corp.example"
  [[registry.mirror]]
  location = "harbor.site.example/corp"
  pull-from-mirror = "tag-only"

[[registry]]
prefix = "ghcr.io/team"
location = "harbor.site.example/ghcr-team"
mirror-by-digest-only = true
  [[registry.mirror]]
  location = "digest-cache.site.example/ghcr-team"

[[registry]]
prefix = "ghcr.io/team/special"
location = "special.site.example/only"
"""


def write(directory, text, name="registries.conf"):
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def plan(sysconf, uri):
    """[(host, repository, insecure)] in the order `uri` would be tried."""
    ref = reference.parse(uri)
    return [(e.host, e.repository, e.insecure)
            for e, _ in registries.load(str(sysconf)).endpoints(ref)]


@pytest.fixture
def site(tmp_path):
    write(tmp_path, SITE)
    return tmp_path


# -- resolution -----------------------------------------------------------------

def test_no_file_keeps_enroots_defaults(tmp_path):
    assert plan(tmp_path, "docker://ubuntu:24.04") == \
        [("registry-1.docker.io", "library/ubuntu", False)]
    assert plan(tmp_path, "docker://nvcr.io#nvidia/cuda:12.9") == \
        [("nvcr.io", "nvidia/cuda", False)]


def test_docker_hub_mirrors_in_order_then_the_hub(site):
    # A tag: the digest-only mirror is skipped.
    assert plan(site, "docker://docker.io#library/ubuntu:24.04") == [
        ("harbor.site.example", "dockerhub/library/ubuntu", False),
        ("registry-1.docker.io", "library/ubuntu", False)]
    # By digest: both mirrors, in file order, the second allowed plain HTTP.
    assert plan(site, f"docker://docker.io#ubuntu@{DIGEST}") == [
        ("harbor.site.example", "dockerhub/library/ubuntu", False),
        ("10.1.2.3:5000", "hub/library/ubuntu", True),
        ("registry-1.docker.io", "library/ubuntu", False)]


def test_short_names_try_the_unqualified_search_registries_in_order(site):
    assert plan(site, "docker://ubuntu:24.04") == [
        ("registry.site.example", "ubuntu", False),
        ("harbor.site.example", "dockerhub/library/ubuntu", False),
        ("registry-1.docker.io", "library/ubuntu", False)]
    assert plan(site, "docker://team/app") == [
        ("registry.site.example", "team/app", False),
        ("harbor.site.example", "dockerhub/team/app", False),
        ("registry-1.docker.io", "team/app", False)]


def test_an_inline_mirror_list_and_a_prefix_defaulting_to_the_location(site):
    assert plan(site, "docker://nvcr.io#nvidia/pytorch:24.01-py3") == [
        ("harbor.site.example", "nvcr/nvidia/pytorch", False),
        ("nvcr.io", "nvidia/pytorch", False)]


def test_blocked_is_refused_naming_the_rule(site):
    with pytest.raises(BerthError) as error:
        plan(site, "docker://nvcr.io#nvidia/private/model:1")
    assert str(error.value) == (
        f"nvcr.io/nvidia/private/model is blocked by the rule for 'nvcr.io/nvidia/private' "
        f"({site}/registries.conf:21)")  # the line of its [[registry]]
    # A path prefix matches on whole components only.
    assert plan(site, "docker://nvcr.io#nvidia/privateer:1")[-1] == \
        ("nvcr.io", "nvidia/privateer", False)
    # The prefix itself, as a repository, is blocked too.
    with pytest.raises(BerthError, match="blocked"):
        plan(site, "docker://nvcr.io#nvidia/private:1")


@pytest.mark.parametrize("uri, matches", [
    ("docker://git.corp.example#team/app:1", True),
    ("docker://a.b.corp.example:5000#team/app:1", True),  # any depth, any port
    ("docker://corp.example#team/app:1", False),  # the domain itself is not a subdomain
    ("docker://evilcorp.example#team/app:1", False),  # a suffix on a label boundary only
    ("docker://corp.example.evil.test#team/app:1", False),
])
def test_wildcard_prefixes_match_subdomains_only(site, uri, matches):
    host = reference.parse(uri).registry
    expected = [("harbor.site.example", "corp/team/app", False), (host, "team/app", False)]
    assert plan(site, uri) == (expected if matches else [(host, "team/app", False)])
    # tag-only: a pull by digest skips that mirror
    digest_uri = uri.rsplit(":", 1)[0] + f"@{DIGEST}"
    assert plan(site, digest_uri) == [(host, "team/app", False)]


def test_the_longest_prefix_wins_whatever_the_file_order(site):
    # ghcr.io/team: location rewritten, its mirror only by digest (mirror-by-digest-only)
    assert plan(site, "docker://ghcr.io#team/tool:1") == \
        [("harbor.site.example", "ghcr-team/tool", False)]
    assert plan(site, f"docker://ghcr.io#team/tool@{DIGEST}") == [
        ("digest-cache.site.example", "ghcr-team/tool", False),
        ("harbor.site.example", "ghcr-team/tool", False)]
    # ghcr.io/team/special is longer, so it wins for its own subtree
    assert plan(site, "docker://ghcr.io#team/special/x:1") == \
        [("special.site.example", "only/x", False)]
    # ... and for the repository that is exactly the prefix: the rest is empty
    assert plan(site, "docker://ghcr.io#team/special:1") == \
        [("special.site.example", "only", False)]
    # other ghcr.io namespaces have no rule
    assert plan(site, "docker://ghcr.io#other/x:1") == [("ghcr.io", "other/x", False)]


def test_wildcard_against_exact_host_longest_wins(tmp_path):
    write(tmp_path, """
[[registry]]
prefix = "build.corp.example"
location = "exact.mirror"
[[registry]]
prefix = "*.corp.example"
[[registry.mirror]]
location = "wild.mirror/corp"
""")
    assert plan(tmp_path, "docker://build.corp.example#a/b") == [("exact.mirror", "a/b", False)]
    assert plan(tmp_path, "docker://test.corp.example#a/b") == [
        ("wild.mirror", "corp/a/b", False), ("test.corp.example", "a/b", False)]


def test_a_rewrite_to_a_bare_host_is_refused_naming_the_rule(tmp_path):
    path = write(tmp_path, '[[registry]]\nprefix = "reg.example/team/app"\n'
                           'location = "mirror.example"\n')
    with pytest.raises(BerthError) as error:
        plan(tmp_path, "docker://reg.example#team/app:1")
    assert str(error.value) == (f"{path}:1: rewriting gives 'mirror.example', which is not "
                                "HOST/REPOSITORY")


def test_an_empty_search_list_refuses_short_names(tmp_path):
    path = write(tmp_path, "unqualified-search-registries = []\n")
    with pytest.raises(BerthError, match=rf"names no registry .*\({path}:1\)"):
        plan(tmp_path, "docker://ubuntu")
    assert plan(tmp_path, "docker://quay.io#a/b") == [("quay.io", "a/b", False)]


def test_drop_ins_replace_rules_of_the_same_prefix_and_top_level_keys(tmp_path):
    write(tmp_path, SITE)
    write(tmp_path, 'unqualified-search-registries = ["quay.io"]\n'
                    '[[registry]]\nprefix = "docker.io"\nlocation = "hub-proxy.example/hub"\n',
          "registries.conf.d/50-hub.conf")
    write(tmp_path, '[[registry]]\nprefix = "docker.io"\nlocation = "last.example/hub"\n',
          "registries.conf.d/90-later.conf")
    write(tmp_path, "this is not read", "registries.conf.d/README")
    # 90-later.conf comes last: its rule replaces both earlier ones, mirrors and all.
    assert plan(tmp_path, "docker://docker.io#library/ubuntu:1") == \
        [("last.example", "hub/library/ubuntu", False)]
    assert plan(tmp_path, "docker://ubuntu:1") == [("quay.io", "ubuntu", False)]
    # The rules of registries.conf the drop-ins did not touch stay.
    assert plan(tmp_path, "docker://nvcr.io#nvidia/x:1")[0][0] == "harbor.site.example"


def test_describe_lists_each_endpoint_and_why(site):
    lines = registries.load(str(site)).describe(reference.parse(f"docker://ubuntu@{DIGEST}"))
    assert lines[0] == (f"registry.site.example/ubuntu@{DIGEST} (https; no rule matches)")
    assert lines[1] == (f"harbor.site.example/dockerhub/library/ubuntu@{DIGEST} "
                        f"(https; mirror 1 for 'docker.io', {site}/registries.conf:8)")
    assert lines[2].startswith(f"10.1.2.3:5000/hub/library/ubuntu@{DIGEST} (https, or http; "
                               "mirror 2 for 'docker.io'")
    assert lines[3] == (f"registry-1.docker.io/library/ubuntu@{DIGEST} "
                        f"(https; location for 'docker.io', {site}/registries.conf:4)")


# -- what berth refuses ----------------------------------------------------------

@pytest.mark.parametrize("text, line, needle", [
    ('short-name-mode = "enforcing"\n', 1, "unsupported key 'short-name-mode'"),
    ('unqualified-search-registries = ["docker.io"]\n\n[aliases]\n"ubuntu" = '
     '"docker.io/library/ubuntu"\n', 3, "unsupported key 'aliases'"),
    ('credential-helpers = ["containers-auth.json"]\n', 1,
     "unsupported key 'credential-helpers': credentials come from the netrc file"),
    ('[registries.search]\nregistries = ["docker.io"]\n', 1, "v1 format"),
    ('[[registry]]\nprefix = "a.example"\n\n[[registry]]\nprefix = "b.example"\n'
     'mirrors = "x"\n', 6, "unsupported [[registry]] key 'mirrors'"),
    ('[[registry]]\nprefix = "a.example"\n[[registry.mirror]]\nlocation = "m.example"\n'
     'pull-from-mirror = "all"\ninsecure-skip-verify = true\n', 6,
     "unsupported [[registry.mirror]] key 'insecure-skip-verify'"),
    ('[[registry]]\nprefix = "a.example"\ninsecure = "yes"\n', 3, "insecure must be true or"),
    ('[[registry]]\nprefix = "a.example"\n[[registry.mirror]]\nlocation = "m.example"\n'
     'pull-from-mirror = "sometimes"\n', 5, "pull-from-mirror must be one of all, digest-only"),
    ('[[registry]]\nprefix = "*.corp.example"\nlocation = "m.example"\n', 3,
     "wildcard prefix '*.corp.example' may not set a location"),
    ('[[registry]]\nprefix = "*.corp.example/team"\n', 2, "is not *.DOMAIN"),
    ('[[registry]]\nprefix = "a.example/app:latest"\n', 2, "names a tag or digest"),
    ('[[registry]]\nprefix = "a.example/Team"\n', 2, "has an invalid path"),
    ('[[registry]]\nblocked = true\n', 1, "needs a prefix or a location"),
    ('unqualified-search-registries = "docker.io"\n', 1, "must be a list of strings"),
    ('unqualified-search-registries = ["docker.io/library"]\n', 1, "is not HOST[:PORT]"),
    ('[[registry]]\nprefix = "a.example"\n[[registry.mirror]]\ninsecure = true\n', 3,
     "a [[registry.mirror]] needs a location"),
])
def test_what_berth_does_not_support_is_an_error_naming_file_and_line(tmp_path, text, line,
                                                                      needle):
    path = write(tmp_path, text, "registries.conf.d/10-site.conf")
    with pytest.raises(BerthError) as error:
        registries.load(str(tmp_path))
    assert str(error.value).startswith(f"{path}:{line}: "), error.value
    assert needle in str(error.value)


def test_toml_errors_name_the_file(tmp_path):
    path = write(tmp_path, '[[registry]]\nprefix = "a.example\n')
    with pytest.raises(BerthError, match=rf"^{path}: not valid TOML: .*line 2"):
        registries.load(str(tmp_path))


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "{a = " * 5000 + "1" + "}" * 5000],
                         ids=["arrays", "inline-tables"])
def test_toml_nested_thousands_deep_is_bad_toml_not_a_traceback(tmp_path, value):
    path = write(tmp_path, f"unqualified-search-registries = {value}\n")
    with pytest.raises(BerthError, match=rf"^{path}: not valid TOML: arrays or inline tables "
                                         "nested too deeply$"):
        registries.load(str(tmp_path))


# A key of 100,000 parts kept tomllib computing for minutes (its time grows
# with the square of a key's parts); an integer past int()'s 4,300 digits
# escaped as a ValueError traceback.
@pytest.mark.parametrize("text, why", [
    ("a = 1\n" + ".".join(["a"] * 100_000) + " = 1\n",
     "a key of more than 100 dotted parts (at line 2, column 1)"),
    ("unqualified-search-registries = " + "9" * 5000 + "\n", "an integer of more than 4300 digits"),
], ids=["100000-part-key", "5000-digit-integer"])
def test_toml_too_costly_to_read_is_refused_in_one_line(tmp_path, text, why):
    path = write(tmp_path, text)
    with pytest.raises(BerthError) as error:
        registries.load(str(tmp_path))
    assert str(error.value) == f"{path}: not valid TOML: {why}"


def test_dots_in_strings_and_comments_are_no_keys_parts(tmp_path):
    dots = "." * 300
    write(tmp_path, f"# {dots}\nunqualified-search-registries = ['c.example'] # {dots} '\n"
                    f"[[registry]]\nprefix = \"a.example\"\nlocation = \"b.example/x\"\n"
                    f"blocked = false # '''{dots}\n")
    assert registries.load(str(tmp_path)).search == ["c.example"]


# -- berth import through the rules, against real registries -------------------------

needs_registry = pytest.mark.skipif(not shutil.which("docker-registry"),
                                    reason="needs docker-registry (Debian package)")
LAYER = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=mirrored\n")))
# what a stale or hostile mirror answers for test/app:v1
FORGED = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=forged\n")))


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """test/app:v1, and the same image as mirrored/test/app:v1 (what a mirror
    with the location HOST/mirrored holds)."""
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.digest = reg.push_image("test/app", "v1", [LAYER])
    reg.push_image("mirrored/test/app", "v1", [LAYER])
    reg.moved = reg.push_image("moved/test/app", "v1", [FORGED])
    yield reg
    reg.stop()


@pytest.fixture
def origin(registry):
    proxy = Proxy(registry.url)
    yield proxy
    proxy.stop()


@pytest.fixture
def mirror(registry):
    proxy = Proxy(registry.url)
    yield proxy
    proxy.stop()


def conf(env, text):
    write(env["ENROOT_SYSCONF_PATH"], text)


# the one request a rule's location gets when a mirror answers for a tag
TAG_CHECK = "HEAD /v2/test/app/manifests/v1"


def manifests(proxy):
    return [p for p in proxy.requests if "/manifests/" in p]


@needs_registry
def test_the_mirror_serves_manifest_and_blobs(tmp_path, env, origin, mirror):
    conf(env, f'[[registry]]\nprefix = "{origin.host}/test"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored/test"\n')
    result = berth(["import", "-o", "a.sqsh", f"docker://{origin.host}#test/app:v1"], env,
                   tmp_path)
    assert result.returncode == 0, result.stderr
    assert origin.requests == [TAG_CHECK]  # the tag checked, no more
    assert "/v2/mirrored/test/app/manifests/v1" in mirror.requests
    assert len(mirror.blob_requests()) == 2  # the config and the layer


@needs_registry
def test_a_mirrors_tag_is_checked_against_the_rules_location(tmp_path, env, origin, mirror,
                                                              registry):
    """A mirror whose tag names another image than the upstream's (stale, or
    one a user made answer on its port) is not used where the upstream
    answers; where it does not (air-gapped, no such tag), the mirror's word
    stands."""
    conf(env, f'[[registry]]\nprefix = "{origin.host}/test"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/moved/test"\n')
    uri = f"docker://{origin.host}#test/app:v1"
    for args in (["-q", "import", "--resolve", uri], ["import", "-o", "a.sqsh", uri]):
        result = berth(args, env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert (f"berth: not using {mirror.host}/moved/test/app:v1: it answers {registry.moved}, "
                f"{origin.host}/test/app:v1 {registry.digest}\n") in result.stderr  # even -q
    assert berth(["-q", "import", "--resolve", uri], env, tmp_path).stdout == (
        f"docker://{origin.host}#test/app@{registry.digest}\n")
    assert mirror.blob_requests() == [] and len(origin.blob_requests()) == 2
    listing = subprocess.run(["unsquashfs", "-cat", str(tmp_path / "a.sqsh"), "etc/os-release"],
                             capture_output=True, text=True, check=True)
    assert listing.stdout == "ID=mirrored\n"

    # the upstream unreachable, or without the tag: the mirror is taken at its word
    dead = f"127.0.0.1:{free_port()}"
    for location in (dead, f"{origin.host}/absent"):
        conf(env, f'[[registry]]\nprefix = "{origin.host}/test"\nlocation = "{location}"\n'
                  f'[[registry.mirror]]\nlocation = "{mirror.host}/moved/test"\n')
        result = berth(["-q", "import", "--resolve", uri], env, tmp_path)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert result.stdout == f"docker://{origin.host}#test/app@{registry.moved}\n"
    # a digest needs no check: it is its own proof
    mirror.requests.clear()
    origin.requests.clear()
    pinned = f"docker://{origin.host}#test/app@{registry.moved}"
    result = berth(["import", "-o", "b.sqsh", pinned], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert origin.requests == []


@needs_registry
def test_a_failing_mirror_falls_through_in_order(tmp_path, env, origin, mirror):
    dead = f"127.0.0.1:{free_port()}"
    conf(env, f'[[registry]]\nprefix = "{origin.host}"\n'
              f'[[registry.mirror]]\nlocation = "{dead}"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/absent"\n')
    uri = f"docker://{origin.host}#test/app:v1"
    result = berth(["import", "-o", "a.sqsh", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{dead}/test/app:v1 failed" in result.stderr
    assert f"{mirror.host}/absent/test/app:v1 failed (image not found" in result.stderr
    assert f"pulling {origin.host}/test/app:v1 from {origin.host}/test/app:v1" in result.stderr
    assert manifests(mirror) == ["/v2/absent/test/app/manifests/v1"]
    assert mirror.blob_requests() == []
    assert len(origin.blob_requests()) == 2  # blobs from the endpoint that gave the manifest

    # Every place fails: one line naming each and why.
    conf(env, f'[[registry]]\nprefix = "{origin.host}"\nlocation = "{mirror.host}/absent"\n'
              f'[[registry.mirror]]\nlocation = "{dead}"\n')
    result = berth(["-q", "import", "-o", "b.sqsh", uri], env, tmp_path)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"berth: error: cannot get {origin.host}/test/app:v1 "
                                    f"from any of 2 places: {dead}/test/app:v1: ")
    assert "Connection refused" in result.stderr
    assert f"; {mirror.host}/absent/test/app:v1: image not found" in result.stderr
    assert not (tmp_path / "b.sqsh").exists()


@needs_registry
def test_blocked_is_refused_before_any_request(tmp_path, env, origin):
    conf(env, f'[[registry]]\nprefix = "{origin.host}/test/app"\nblocked = true\n')
    uri = f"docker://{origin.host}#test/app:v1"
    for extra in ([], ["--reuse"], ["--cache-only"]):
        result = berth(["import", *extra, uri], env, tmp_path)
        assert result.returncode == 1 and result.stderr.count("\n") == 1
        assert f"is blocked by the rule for '{origin.host}/test/app'" in result.stderr
    assert origin.requests == []
    dry = berth(["import", "--dry-run", uri], env, tmp_path)
    assert dry.returncode == 1 and dry.stdout.startswith("blocked: ")


@needs_registry
def test_dry_run_prints_the_order_and_asks_nobody(tmp_path, env, origin, mirror):
    path = write(env["ENROOT_SYSCONF_PATH"],
                 f'[[registry]]\nprefix = "{origin.host}"\n'
                 f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored"\ninsecure = true\n')
    result = berth(["import", "--dry-run", f"docker://{origin.host}#test/app:v1"], env,
                   tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{mirror.host}/mirrored/test/app:v1 (https, or http; mirror 1 for '{origin.host}', "
        f"{path}:3)",
        f"{origin.host}/test/app:v1 (https; location for '{origin.host}', {path}:1)"]
    assert origin.requests == [] and mirror.requests == []
    assert not (tmp_path / "cache").exists() and list(tmp_path.glob("*.sqsh")) == []


@needs_registry
def test_insecure_allows_plain_http_for_that_endpoint_only(tmp_path, env, origin, mirror):
    env = dict(env, ENROOT_ALLOW_HTTP="no")
    conf(env, f'[[registry]]\nprefix = "{origin.host}"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored"\ninsecure = true\n')
    result = berth(["-q", "import", "-o", "a.sqsh", f"docker://{origin.host}#test/app:v1"],
                   env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert manifests(mirror) == ["/v2/mirrored/test/app/manifests/v1"]
    # The origin has no `insecure`: once the mirror is gone, plain HTTP is refused there.
    conf(env, f'[[registry]]\nprefix = "{origin.host}"\n'
              f'[[registry.mirror]]\nlocation = "127.0.0.1:{free_port()}"\ninsecure = true\n')
    result = berth(["-q", "import", "-o", "b.sqsh", f"docker://{origin.host}#test/app:v1"],
                   env, tmp_path)
    assert result.returncode == 1
    assert f"{origin.host}/test/app:v1: registry {origin.host} does not speak HTTPS" in \
        result.stderr
    assert origin.blob_requests() == []


@needs_registry
def test_mirror_credentials_come_from_the_credentials_file_by_mirror_host(
        tmp_path, env, registry, origin):
    guarded = Proxy(registry.url, auth="basic", login="mirroruser", password="mirrorpass")
    try:
        conf(env, f'[[registry]]\nprefix = "{origin.host}"\n'
                  f'[[registry.mirror]]\nlocation = "{guarded.host}/mirrored"\n')
        credentials = Path(env["ENROOT_CONFIG_PATH"]) / ".credentials"
        credentials.parent.mkdir(parents=True, exist_ok=True)
        credentials.write_text(f"machine {guarded.host} login mirroruser password mirrorpass\n")
        credentials.chmod(0o600)
        # USER@ names the origin's account; the mirror takes its own entry.
        result = berth(["-q", "import", "-o", "a.sqsh",
                        f"docker://bob@{origin.host}#test/app:v1"], env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert origin.requests == [TAG_CHECK]
        assert len(guarded.blob_requests()) == 2
        # Without the entry the mirror refuses; the origin (no auth) then serves.
        credentials.write_text("machine elsewhere.example login x password y\n")
        result = berth(["import", "-o", "b.sqsh", f"docker://{origin.host}#test/app:v1"],
                       env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"registry {guarded.host} refused access" in result.stderr
        assert manifests(origin) and origin.blob_requests()  # (the layer was cached already)
    finally:
        guarded.stop()


@needs_registry
def test_one_cache_entry_whether_the_mirror_or_the_origin_answered(tmp_path, env, origin,
                                                                    mirror):
    uri = f"docker://{origin.host}#test/app:v1"
    conf(env, f'[[registry]]\nprefix = "{origin.host}/test"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored/test"\n')
    first = berth(["-q", "import", "--cache-only", uri], env, tmp_path)
    assert first.returncode == 0 and origin.requests == [TAG_CHECK], first.stderr
    (Path(env["ENROOT_SYSCONF_PATH"]) / "registries.conf").unlink()
    second = berth(["-q", "import", "--cache-only", uri], env, tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout  # the same entry: the manifest digest is the key
    assert manifests(origin) and origin.blob_requests() == []  # nothing built again


@needs_registry
def test_short_name_through_the_search_registries(tmp_path, env, origin, mirror):
    dead = f"127.0.0.1:{free_port()}"
    conf(env, f'unqualified-search-registries = ["{dead}", "{origin.host}"]\n'
              f'[[registry]]\nprefix = "{origin.host}"\n'
              f'[[registry.mirror]]\nlocation = "{mirror.host}/mirrored"\n')
    result = berth(["-q", "import", "-o", "a.sqsh", "docker://test/app:v1"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert manifests(mirror) == ["/v2/mirrored/test/app/manifests/v1"]
    assert origin.requests == [TAG_CHECK]


@needs_registry
@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")
@pytest.mark.parametrize("verb", ["--cache-only", "--resolve"])
def test_insecure_skips_tls_verification_of_that_endpoint(tmp_path, env, registry, origin,
                                                          verb):
    """A mirror with a self-signed certificate: refused unless `insecure`, or
    unless REQUESTS_CA_BUNDLE names it (requests for an import, Direct for a
    resolve: the same rules), and never tried over plain HTTP instead."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls = Proxy(registry.url)
    tls.server.shutdown()  # serve again, over TLS
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls.server.socket = context.wrap_socket(tls.server.socket, server_side=True)
    tls.thread = threading.Thread(target=tls.server.serve_forever, daemon=True)
    tls.thread.start()
    # (requests lets REQUESTS_CA_BUNDLE undo a session's verify=False: set it)
    env = dict(env, ENROOT_ALLOW_HTTP="no", REQUESTS_CA_BUNDLE=requests.certs.where())
    uri = f"docker://{origin.host}#test/app:v1"
    try:
        for insecure, bundle in (("false", None), ("true", None), ("false", str(cert))):
            conf(env, f'[[registry]]\nprefix = "{origin.host}"\n'
                      f'[[registry.mirror]]\nlocation = "{tls.host}/mirrored"\n'
                      f'insecure = {insecure}\n')
            tls.requests.clear()
            run_env = dict(env, REQUESTS_CA_BUNDLE=bundle) if bundle else env
            result = berth(["-q", "import", verb, uri], run_env, tmp_path)
            if insecure == "false" and not bundle:
                assert result.returncode == 1, result.stderr
                assert f"{tls.host}/mirrored/test/app:v1: registry {tls.host}: its TLS " \
                       "certificate is not trusted ([SSL: CERTIFICATE_VERIFY_FAILED]" in \
                       result.stderr
                assert tls.requests == []
                # HTTP allowed: the mirror, which has TLS, is still not asked over
                # plain HTTP (that would fail on its TLS port, saying something
                # else); the origin, plain HTTP, serves instead
                result = berth(["import", verb, uri], dict(run_env, ENROOT_ALLOW_HTTP="yes"),
                               tmp_path)
                assert result.returncode == 0, result.stderr
                assert f"{tls.host}/mirrored/test/app:v1 failed (registry {tls.host}: its TLS " \
                       "certificate is not trusted" in result.stderr
                assert tls.requests == []
                origin.requests.clear()
            else:
                assert result.returncode == 0, result.stderr
                assert manifests(tls) == ["/v2/mirrored/test/app/manifests/v1"]
                assert origin.requests == []
    finally:
        tls.stop()
