"""The registries.conf and cache filters of roles/container_runtime and
roles/registry_cache: what they render is what the runtime reads, and each
malformed variable is one message naming it (never a password)."""

import importlib.util
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))
from berth.errors import BerthError  # noqa: E402
from berth.image import reference, registries  # noqa: E402


def _filters(path, name):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


RUNTIME = _filters("roles/container_runtime/filter_plugins/registries.py", "cr_registries")
CACHE = _filters("roles/registry_cache/filter_plugins/registry_cache.py", "rc_registry_cache")
SECRET = "s3cret-Token-9"
HOSTVARS = {
    "cache1": {"registry_cache_upstreams": [
        {"name": "hub", "prefix": "docker.io", "remoteurl": "https://registry-1.docker.io", "port": 5101,
         "username": "bot", "password": SECRET},
        {"name": "team", "prefix": "ghcr.io/team", "remoteurl": "https://ghcr.io", "port": 5102}]},
    "cache2": {"registry_cache_address": "10.0.0.2", "registry_cache_tls_certificate": "/etc/ssl/c.pem",
               "registry_cache_upstreams": [{"name": "hub", "prefix": "docker.io", "port": 5101}]},
}


def render(rules, search=None, caches=()):
    merged = RUNTIME["berth_registries_rules"](rules, list(caches), HOSTVARS)
    return RUNTIME["berth_registries_toml"](merged, search)


def endpoints(tmp_path, text, uri):
    (tmp_path / "registries.conf").write_text(text)
    plan = registries.load(str(tmp_path)).endpoints(reference.parse(uri))
    return [f"{endpoint.host}/{endpoint.repository}" for endpoint, _ in plan]


def test_caches_come_first_in_inventory_order_then_the_sites_mirrors(tmp_path):
    text = render([{"prefix": "docker.io", "mirrors": [{"location": "harbor.example/hub"}]}],
                  ["docker.io"], ["cache1", "cache2"])
    assert SECRET not in text
    assert endpoints(tmp_path, text, "docker://ubuntu:24.04") == [
        "cache1:5101/library/ubuntu", "10.0.0.2:5101/library/ubuntu",
        "harbor.example/hub/library/ubuntu", "registry-1.docker.io/library/ubuntu"]
    loaded = registries.load(str(tmp_path))
    insecure = {e.host: e.insecure for e, _ in loaded.endpoints(reference.parse("docker://ubuntu"))}
    assert insecure["cache1:5101"] and not insecure["10.0.0.2:5101"]  # the second serves TLS


def test_a_cached_prefix_without_a_rule_gets_one_keeping_its_path(tmp_path):
    text = render([], None, ["cache1"])
    assert endpoints(tmp_path, text, "docker://ghcr.io#team/app:1") == [
        "cache1:5102/team/app", "ghcr.io/team/app"]


def test_a_blocked_rule_gets_no_mirror_and_is_refused(tmp_path):
    text = render([{"prefix": "docker.io", "blocked": True}], None, ["cache1"])
    (tmp_path / "registries.conf").write_text(text)
    assert "cache1:5101" not in text
    with pytest.raises(registries.Blocked, match="docker.io"):
        registries.load(str(tmp_path)).endpoints(reference.parse("docker://ubuntu"))


def test_no_rules_and_no_cache_render_an_empty_file(tmp_path):
    assert render([]).strip() == ""
    assert endpoints(tmp_path, "", "docker://registry.example.org#a/b") == ["registry.example.org/a/b"]


@pytest.mark.parametrize("rules, search, message", [
    ("x", None, "container_runtime_registries: 'registry' must be [[registry]] tables"),
    ([{"prefix": "a b"}], None, "container_runtime_registries[0].prefix: prefix 'a b' does not start with"),
    ([{"insecure": True}], None, "container_runtime_registries[0]: a [[registry]] needs a prefix or a location"),
    ([{"prefix": "r.io", "blocked": "yes"}], None,
     "container_runtime_registries[0].blocked: blocked must be true or false"),
    ([{"prefix": "r.io", "mirror": []}], None, "container_runtime_registries[0]: unknown key 'mirror'"),
    ([{"prefix": "r.io", "mirrors": [{"url": "m"}]}], None,
     "container_runtime_registries[0].mirrors[0].url: unsupported [[registry.mirror]] key 'url'"),
    ([{"prefix": "r.io", "mirrors": [{"location": "m", "pull-from-mirror": "some"}]}], None,
     "container_runtime_registries[0].mirrors[0].pull-from-mirror: pull-from-mirror must be one of"),
    ([], "docker.io", "container_runtime_unqualified_search_registries: unqualified-search-registries must be a list"),
    ([], ["docker.io/x"],
     "container_runtime_unqualified_search_registries: unqualified-search registry 'docker.io/x' is not HOST[:PORT]"),
])
def test_malformed_rules_are_one_line_naming_the_variable(rules, search, message):
    problems = RUNTIME["berth_registries_problems"](rules, search, [], {})
    assert problems and problems[0].startswith(message), problems
    assert all("\n" not in problem for problem in problems)


def test_rendering_malformed_rules_raises_the_first_problem():
    with pytest.raises(AnsibleFilterError, match=r"container_runtime_registries\[0\]\.oops: unsupported"):
        RUNTIME["berth_registries_rules"]([{"prefix": "r.io", "oops": 1}], [], {})


@pytest.mark.parametrize("rule", [
    {"prefix": "*.r.io", "location": "mirror.r.io"},
    {"prefix": "r.io", "mirrors": [{"location": "m.io/Team"}]},
    {"prefix": "r.io/x", "mirror-by-digest-only": "true"},
])
def test_the_role_refuses_what_the_runtime_refuses_in_its_own_words(tmp_path, rule):
    """One check of the rules: the runtime's, naming the variable where a
    registries.conf's problem names FILE:LINE."""
    problems = RUNTIME["berth_registries_problems"]([rule], None, [], {})
    (tmp_path / "registries.conf").write_text(RUNTIME["berth_registries_toml"]([rule]))
    with pytest.raises(BerthError) as refused:
        registries.load(str(tmp_path))
    in_file = str(refused.value).split(": ", 1)[1]
    assert len(problems) == 1 and problems[0].startswith("container_runtime_registries[0]"), problems
    assert problems[0].split(": ", 1)[1] == in_file


def test_a_cache_entry_without_a_port_is_named():
    problems = RUNTIME["berth_registries_problems"](
        [], None, ["c"], {"c": {"registry_cache_upstreams": [{"prefix": "docker.io"}]}})
    assert problems == ["registry_cache_upstreams[0] of c: needs a prefix HOST[:PORT][/PATH] and a port"]


def test_credentials_checks_never_print_the_password():
    problems = RUNTIME["berth_credentials_problems"](
        {"alice": [{"machine": "r.io", "login": "alice", "password": "has space"}],
         "bob": [{"machine": "r.io/path", "login": "bob", "password": SECRET}],
         "carol": [{"machine": "r.io", "login": "carol"}]})
    assert problems == [
        "container_runtime_user_credentials['alice'][0].password: empty, or has spaces, quotes or # "
        "(netrc cannot hold them)",
        "container_runtime_user_credentials['bob'][0].machine: 'r.io/path' is not HOST[:PORT]",
        "container_runtime_user_credentials['carol'][0]: expected exactly the keys machine, login, password",
    ]
    assert RUNTIME["berth_credentials_problems"]({"alice": [
        {"machine": "r.io:5000", "login": "alice", "password": SECRET}]}) == []


@pytest.mark.parametrize("upstream, message", [
    ({"name": "Hub", "prefix": "docker.io", "remoteurl": "https://r.io", "port": 1}, "[0].name: 'Hub'"),
    ({"name": "hub", "prefix": "docker io", "remoteurl": "https://r.io", "port": 1}, "[0].prefix:"),
    ({"name": "hub", "prefix": "docker.io", "remoteurl": "ftp://r.io", "port": 1}, "[0].remoteurl: 'ftp://r.io'"),
    ({"name": "hub", "prefix": "docker.io", "remoteurl": "https://r.io", "port": 70000}, "[0].port: 70000"),
    ({"name": "hub", "prefix": "docker.io", "remoteurl": "https://r.io", "port": 1, "password": SECRET},
     "[0]: give both username and password"),
    ({"name": "hub", "prefix": "docker.io", "remoteurl": "https://r.io", "port": 1, "ttl": "1h"},
     "[0]: unknown key 'ttl'"),
])
def test_malformed_upstreams_are_named(upstream, message):
    problems = CACHE["registry_cache_problems"]([upstream])
    assert len(problems) == 1 and problems[0].startswith("registry_cache_upstreams" + message), problems
    assert SECRET not in problems[0]


def test_one_instance_per_upstream_needs_distinct_names_and_ports():
    base = {"prefix": "docker.io", "remoteurl": "https://r.io"}
    problems = CACHE["registry_cache_problems"]([{**base, "name": "a", "port": 1}, {**base, "name": "a", "port": 1}])
    assert problems == ["registry_cache_upstreams[1].name: 'a' is also registry_cache_upstreams[0]'s",
                        "registry_cache_upstreams[1].port: 1 is also registry_cache_upstreams[0]'s"]


def test_size_and_tls_knobs():
    assert CACHE["registry_cache_problems"]([], "20Q") == [
        "registry_cache_max_size: '20Q' is not bytes or a size such as 200G"]
    assert CACHE["registry_cache_problems"]([], "", "/c.pem", "") == [
        "registry_cache_tls_certificate, registry_cache_tls_key: set both or neither"]
    assert [CACHE["registry_cache_bytes"](size) for size in ("", "512", "2K", "3g")] == [0, 512, 2048, 3 << 30]


def test_plain_http_only_on_a_port_no_user_of_the_cache_host_may_bind():
    upstreams = [{"name": "a", "prefix": "docker.io", "remoteurl": "https://r.io", "port": 501},
                 {"name": "b", "prefix": "nvcr.io", "remoteurl": "https://nvcr.io", "port": 5102}]
    assert CACHE["registry_cache_problems"](upstreams, "", "", "", 1024) == [
        "registry_cache_upstreams[1].port: 5102 may be bound by any user of this host "
        "(net.ipv4.ip_unprivileged_port_start is 1024), and the cache serves plain HTTP: one "
        "could answer the nodes' pulls while the cache restarts; use a port below 1024, or set "
        "registry_cache_tls_certificate and registry_cache_tls_key"]
    # a host where anyone binds any port (a Docker container's default): no plain HTTP at all
    assert len(CACHE["registry_cache_problems"](upstreams, "", "", "", 0)) == 2
    # TLS: the certificate is what the nodes trust, on any port
    assert CACHE["registry_cache_problems"](upstreams, "", "/c.pem", "/k.pem", None) == []


def test_the_size_is_read_as_berths_max_size():
    """The runtime's grammar (berth/units.py): decimals and a B or iB too."""
    assert [CACHE["registry_cache_bytes"](size) for size in ("1.5T", "500GB", "500GiB")] == [
        3 << 39, 500 << 30, 500 << 30]
    assert CACHE["registry_cache_problems"]([], "1.5T") == []
    assert CACHE["registry_cache_problems"]([], "20 G") == [
        "registry_cache_max_size: '20 G' is not bytes or a size such as 200G"]
