"""registries.conf (containers-registries.conf v2, as berth reads it) from the
role's variables, with the registry_cache hosts' instances first in each
mirror list. Every problem is one line naming the variable, so preflight can
refuse bad input before any host changes; the runtime checks the rendered
file again when it is written."""

import importlib.util
import re
from pathlib import Path

from ansible.errors import AnsibleFilterError

_RULE_KEYS = {"prefix", "location", "insecure", "blocked", "mirror-by-digest-only", "mirrors"}
_MIRROR_KEYS = {"location", "insecure", "pull-from-mirror"}
_PULL = ("all", "digest-only", "tag-only")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}\.)*{_LABEL}(?::[0-9]{{1,5}})?"
_PATH = r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_NAME = re.compile(_HOST + _PATH)
_WILDCARD = re.compile(rf"\*\.(?:{_LABEL}\.)*{_LABEL}")
_SEARCH = re.compile(_HOST)
_TOKEN = re.compile(r"[^\s\"'#]+")


def _writer():
    """The runtime's TOML writer (runtime/berth/tomlwrite.py, Berth's one),
    loaded by its path in this checkout: the controller need not have the
    runtime installed."""
    path = Path(__file__).resolve().parents[3] / "runtime" / "berth" / "tomlwrite.py"
    spec = importlib.util.spec_from_file_location("berth_tomlwrite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TOML = _writer()


def _string(problems, where, value, pattern, what):
    if not isinstance(value, str) or not pattern.fullmatch(value):
        problems.append(f"{where}: {value!r} is not {what}")


def _bool(problems, where, value):
    if not isinstance(value, bool):
        problems.append(f"{where}: {value!r} is not true or false")


def _check_rules(rules, problems):
    if not isinstance(rules, list):
        problems.append("container_runtime_registries: expected a list of rules")
        return
    for index, rule in enumerate(rules):
        where = f"container_runtime_registries[{index}]"
        if not isinstance(rule, dict):
            problems.append(f"{where}: expected a mapping with prefix, location, mirrors ...")
            continue
        for key in sorted(set(rule) - _RULE_KEYS):
            problems.append(f"{where}: unknown key '{key}' (known: {', '.join(sorted(_RULE_KEYS))})")
        if "prefix" not in rule and "location" not in rule:
            problems.append(f"{where}: needs a prefix or a location")
        if "prefix" in rule and not (isinstance(rule["prefix"], str) and _WILDCARD.fullmatch(rule["prefix"])):
            _string(problems, f"{where}.prefix", rule["prefix"], _NAME, "HOST[:PORT][/PATH] or *.DOMAIN")
        if "location" in rule:
            _string(problems, f"{where}.location", rule["location"], _NAME, "HOST[:PORT][/PATH]")
        for key in ("insecure", "blocked", "mirror-by-digest-only"):
            if key in rule:
                _bool(problems, f"{where}.{key}", rule[key])
        mirrors = rule.get("mirrors", [])
        if not isinstance(mirrors, list):
            problems.append(f"{where}.mirrors: expected a list of mirrors")
            continue
        for number, mirror in enumerate(mirrors):
            at = f"{where}.mirrors[{number}]"
            if not isinstance(mirror, dict):
                problems.append(f"{at}: expected a mapping with location, insecure, pull-from-mirror")
                continue
            for key in sorted(set(mirror) - _MIRROR_KEYS):
                problems.append(f"{at}: unknown key '{key}' (known: {', '.join(sorted(_MIRROR_KEYS))})")
            _string(problems, f"{at}.location", mirror.get("location"), _NAME, "HOST[:PORT][/PATH]")
            if "insecure" in mirror:
                _bool(problems, f"{at}.insecure", mirror["insecure"])
            if "pull-from-mirror" in mirror and mirror["pull-from-mirror"] not in _PULL:
                problems.append(f"{at}.pull-from-mirror: {mirror['pull-from-mirror']!r} is not one of {', '.join(_PULL)}")


def _cache_mirrors(cache_hosts, hostvars, problems):
    """{prefix: [mirror, ...]}: each cache host's instances, in inventory order."""
    mirrors = {}
    for host in cache_hosts:
        facts = hostvars[host]
        address = facts.get("registry_cache_address") or host
        tls = bool(facts.get("registry_cache_tls_certificate"))
        upstreams = facts.get("registry_cache_upstreams") or []
        if not isinstance(upstreams, list):
            problems.append(f"registry_cache_upstreams of {host}: expected a list")
            continue
        for index, upstream in enumerate(upstreams):
            where = f"registry_cache_upstreams[{index}] of {host}"
            prefix = upstream.get("prefix") if isinstance(upstream, dict) else None
            port = upstream.get("port") if isinstance(upstream, dict) else None
            if not isinstance(prefix, str) or not _NAME.fullmatch(prefix) or not str(port).isdigit():
                problems.append(f"{where}: needs a prefix HOST[:PORT][/PATH] and a port")
                continue
            # The cache mirrors the upstream's whole namespace: a prefix's
            # path (ghcr.io/team) stays in the mirror's location.
            path = prefix.partition("/")[2]
            mirror = {"location": f"{address}:{int(port)}" + (f"/{path}" if path else "")}
            if not tls:
                mirror["insecure"] = True
            mirrors.setdefault(prefix, []).append(mirror)
    return mirrors


def _check(rules, search, cache_hosts, hostvars):
    problems = []
    _check_rules(rules, problems)
    if search is not None:
        if not isinstance(search, list):
            problems.append("container_runtime_unqualified_search_registries: expected a list of HOST[:PORT]")
        else:
            for index, host in enumerate(search):
                _string(problems, f"container_runtime_unqualified_search_registries[{index}]",
                        host, _SEARCH, "HOST[:PORT]")
    caches = _cache_mirrors(cache_hosts or [], hostvars, problems)
    return problems, caches


def berth_registries_problems(rules, search=None, cache_hosts=None, hostvars=None):
    """One line per problem of the rule variables (empty: all good)."""
    return _check(rules, search, cache_hosts, hostvars)[0]


def berth_registries_rules(rules, cache_hosts=None, hostvars=None):
    """The rules with the caches' mirrors first (a rule added for a cached
    prefix nobody wrote a rule for). A blocked rule gets no mirror."""
    problems, caches = _check(rules, None, cache_hosts, hostvars)
    if problems:
        raise AnsibleFilterError(problems[0])
    merged = []
    for rule in rules:
        rule = dict(rule)
        prefix = rule.get("prefix", rule.get("location"))
        if prefix in caches and not rule.get("blocked"):
            rule["mirrors"] = caches.pop(prefix) + list(rule.get("mirrors", []))
        else:
            caches.pop(prefix, None)
        merged.append(rule)
    merged.extend({"prefix": prefix, "mirrors": mirrors} for prefix, mirrors in caches.items())
    return merged


def berth_registries_toml(rules, search=None):
    """The TOML text of already merged rules (preflight has refused what
    the writer could not write)."""
    out = []
    if search is not None:
        key = "unqualified-search-registries"
        out.append(f"{key} = {_TOML.value(list(search), key)}")
        out.append("")
    for rule in rules:
        out.append("[[registry]]")
        for key in ("prefix", "location", "insecure", "blocked", "mirror-by-digest-only"):
            if key in rule:
                out.append(f"{key} = {_TOML.value(rule[key], key)}")
        for mirror in rule.get("mirrors", []):
            out.append("  [[registry.mirror]]")
            for key in ("location", "insecure", "pull-from-mirror"):
                if key in mirror:
                    out.append(f"  {key} = {_TOML.value(mirror[key], key)}")
        out.append("")
    return "\n".join(out)


def berth_credentials_problems(users):
    """container_runtime_user_credentials: {user: [{machine, login, password}]}."""
    problems = []
    if not isinstance(users, dict):
        return ["container_runtime_user_credentials: expected {user: [{machine, login, password}, ...]}"]
    for user, entries in users.items():
        where = f"container_runtime_user_credentials[{user!r}]"
        if not isinstance(user, str) or not re.fullmatch(r"[a-z_][a-z0-9_.-]*[$]?", user):
            problems.append(f"{where}: not a user name")
        if not isinstance(entries, list):
            problems.append(f"{where}: expected a list of {{machine, login, password}}")
            continue
        for index, entry in enumerate(entries):
            at = f"{where}[{index}]"
            if not isinstance(entry, dict) or set(entry) != {"machine", "login", "password"}:
                problems.append(f"{at}: expected exactly the keys machine, login, password")
                continue
            _string(problems, f"{at}.machine", entry["machine"], _SEARCH, "HOST[:PORT]")
            _string(problems, f"{at}.login", entry["login"], _TOKEN, "a login without spaces, quotes or #")
            # The password itself is never printed.
            if not isinstance(entry["password"], str) or not _TOKEN.fullmatch(entry["password"]):
                problems.append(f"{at}.password: empty, or has spaces, quotes or # (netrc cannot hold them)")
    return problems


class FilterModule:
    def filters(self):
        return {
            "berth_registries_problems": berth_registries_problems,
            "berth_registries_rules": berth_registries_rules,
            "berth_registries_toml": berth_registries_toml,
            "berth_credentials_problems": berth_credentials_problems,
        }
