"""registries.conf (containers-registries.conf v2, as berth reads it) from the
role's variables, with the registry_cache hosts' instances first in each
mirror list. The rules are checked by the runtime's own code
(runtime/berth/image/registries.py of this checkout), its messages naming
the variable where they name FILE:LINE, so preflight refuses before any host
changes what the runtime would refuse in the file."""

import re
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The runtime of this checkout, first on the path: a berth installed on the
# controller, of another version, plays no part.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "runtime"))
from berth import tomlwrite
from berth.errors import BerthError
from berth.image import registries

_RULES = "container_runtime_registries"
_SEARCH = "container_runtime_unqualified_search_registries"
_TOKEN = re.compile(r"[^\s\"'#]+")


class _Variables:
    """Where the runtime's checks place a problem: the role's variable
    (container_runtime_registries[0].mirrors[1].location), for a file's
    FILE:LINE."""

    @staticmethod
    def at(scope, key):
        if not scope:
            return _SEARCH if key == "unqualified-search-registries" else _RULES
        where = f"{_RULES}[{scope[1]}]"
        if len(scope) == 4:
            where += f".mirrors[{scope[3]}]"
        if key is not None:
            where += ".mirrors" if key == "mirror" else f".{key}"
        return where


def _tables(rules):
    """The rules as registries.conf's tables: a rule's mirrors are its
    [[registry.mirror]] tables (mirror). Anything else goes as it is, for
    the runtime to refuse."""
    if not isinstance(rules, list):
        return rules
    tables = []
    for rule in rules:
        if isinstance(rule, dict):
            rule = {("mirror" if key == "mirrors" else key): value for key, value in rule.items()}
        tables.append(rule)
    return tables


def _check_rules(rules, search):
    """The runtime's first problem with the rules (and the search list, when given), or None."""
    for index, rule in enumerate(rules if isinstance(rules, list) else []):
        # registries.conf's own name, which _tables gives the role's mirrors
        if isinstance(rule, dict) and "mirror" in rule:
            return (f"{_RULES}[{index}]: unknown key 'mirror' "
                    "(a rule lists its mirrors under mirrors)")
    data = {"registry": _tables(rules)}
    if search is not None:
        data["unqualified-search-registries"] = search
    try:
        registries.check(data, _Variables)
    except BerthError as e:
        return str(e)
    return None


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
            if not isinstance(prefix, str) or not str(port).isdigit():
                problems.append(f"{where}: needs a prefix HOST[:PORT][/PATH] and a port")
                continue
            try:
                registries.check_name(f"{where}.prefix", "prefix", prefix)
            except BerthError as e:
                problems.append(str(e))
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
    problem = _check_rules(rules, search)
    problems = [problem] if problem else []
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
        out.append(f"{key} = {tomlwrite.value(list(search), key)}")
        out.append("")
    for rule in rules:
        out.append("[[registry]]")
        for key in ("prefix", "location", "insecure", "blocked", "mirror-by-digest-only"):
            if key in rule:
                out.append(f"{key} = {tomlwrite.value(rule[key], key)}")
        for mirror in rule.get("mirrors", []):
            out.append("  [[registry.mirror]]")
            for key in ("location", "insecure", "pull-from-mirror"):
                if key in mirror:
                    out.append(f"  {key} = {tomlwrite.value(mirror[key], key)}")
        out.append("")
    return "\n".join(out)


def _string(problems, where, value, pattern, what):
    if not isinstance(value, str) or not pattern.fullmatch(value):
        problems.append(f"{where}: {value!r} is not {what}")


def berth_credentials_problems(users):
    """container_runtime_user_credentials: {user: [{machine, login, password}]}."""
    problems = []
    if not isinstance(users, dict):
        return ["container_runtime_user_credentials: "
                "expected {user: [{machine, login, password}, ...]}"]
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
            _string(problems, f"{at}.machine", entry["machine"], registries.HOST, "HOST[:PORT]")
            _string(problems, f"{at}.login", entry["login"], _TOKEN,
                    "a login without spaces, quotes or #")
            # The password itself is never printed.
            if not isinstance(entry["password"], str) or not _TOKEN.fullmatch(entry["password"]):
                problems.append(f"{at}.password: empty, or has spaces, quotes or # "
                                "(netrc cannot hold them)")
    return problems


class FilterModule:
    def filters(self):
        return {
            "berth_registries_problems": berth_registries_problems,
            "berth_registries_rules": berth_registries_rules,
            "berth_registries_toml": berth_registries_toml,
            "berth_credentials_problems": berth_credentials_problems,
        }
