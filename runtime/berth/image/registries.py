"""Registry mirrors and rewrite rules: containers-registries.conf (v2 format).

The admin's files, read in this order (a later one overrides):
`$ENROOT_SYSCONF_PATH/registries.conf`, then
`$ENROOT_SYSCONF_PATH/registries.conf.d/*.conf` in lexical order. In a
drop-in, a `[[registry]]` whose prefix an earlier file used replaces that
rule whole; a top-level key set there replaces the earlier value.

Supported keys (any other key is an error naming its file and line):

    unqualified-search-registries = ["HOST[:PORT]", ...]
    [[registry]]
    prefix = "HOST[:PORT][/PATH]" | "*.DOMAIN"   (default: location)
    location = "HOST[:PORT][/PATH]"               (default: prefix; unset with *.DOMAIN)
    insecure = BOOL                               (plain HTTP, unverified TLS)
    blocked = BOOL
    mirror-by-digest-only = BOOL
    [[registry.mirror]]
    location = "HOST[:PORT][/PATH]"
    insecure = BOOL
    pull-from-mirror = "all" | "digest-only" | "tag-only"

A reference matches the rule with the longest prefix: a path prefix on
whole path components (`reg.io/team` matches `reg.io/team/app`, not
`reg.io/teamx/app` nor `reg.io:5000/team/app`), `*.DOMAIN` any host below
DOMAIN (not DOMAIN itself), with any port. Its endpoints are the rule's
mirrors in order, then its location; the matched prefix is replaced by
each one's location. Docker Hub is `docker.io` here, as in those files.
"""

import collections
import os
import re

from berth import tomlread
from berth.config import files_in
from berth.errors import BerthError
from berth.image.reference import DEFAULT_REGISTRY

FILE = "registries.conf"
DROPIN_DIR = "registries.conf.d"
HUB = "docker.io"  # Docker Hub's name in these files; its API answers at DEFAULT_REGISTRY
_HUB_ALIASES = {HUB, "index.docker.io", DEFAULT_REGISTRY}
_MAX_FILE = 1 << 20

# HOST[:PORT]; the roles check their registry hosts with it too
HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)*"
                  r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?::[0-9]{1,5})?")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_WILDCARD = re.compile(r"\*\.((?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)")
_PULL_FROM_MIRROR = ("all", "digest-only", "tag-only")
_TOP_KEYS = {"unqualified-search-registries", "registry"}
_REGISTRY_KEYS = {"prefix", "location", "insecure", "blocked", "mirror-by-digest-only",
                  "mirror"}
_MIRROR_KEYS = {"location", "insecure", "pull-from-mirror"}
# Keys of the format berth does not implement, and what to say about them.
_UNSUPPORTED = {
    "short-name-mode": "berth never prompts: a short name is tried against each "
                       "unqualified-search registry in order",
    "aliases": "short-name aliases are not supported; write the full name",
    "credential-helpers": "credentials come from the netrc file "
                          "$ENROOT_CONFIG_PATH/.credentials",
    "additional-layer-store-auth-helper": "not supported",
    "registries": "that is the v1 format ([registries.search]); write v2 [[registry]] tables",
}


class Endpoint(collections.namedtuple("Endpoint", "host repository insecure what mirror",
                                      defaults=(False,))):
    """One place to ask for an image: host[:port] (connected to as is),
    repository there, whether plain HTTP or unverified TLS is allowed, and
    what it is, for messages ("mirror of PREFIX (FILE:LINE)")."""
    __slots__ = ()

    def name(self, ref):
        suffix = f"@{ref.digest}" if ref.digest else f":{ref.tag}"
        return f"{self.host}/{self.repository}{suffix}"


_Mirror = collections.namedtuple("_Mirror", "location insecure pull_from where")


class _Rule(collections.namedtuple(
        "_Rule", "prefix location insecure blocked digest_only mirrors where")):
    """One [[registry]] table; `where` is FILE:LINE of it."""
    __slots__ = ()

    @property
    def wildcard(self):
        return self.prefix.startswith("*.")


class Blocked(BerthError):
    pass


class Registries:
    """The rules of the admin's files; none when there are none."""

    def __init__(self):
        self.rules = {}  # prefix -> _Rule, in file order
        self.search = None  # unqualified-search-registries, or None when unset
        self.search_where = ""

    # -- resolution ----------------------------------------------------------

    def rule_for(self, name):
        """The rule with the longest prefix matching `name` (HOST/PATH), or None."""
        best, best_length = None, -1
        host = name.split("/", 1)[0].lower()
        for rule in self.rules.values():
            if rule.wildcard:
                bare = host.rsplit(":", 1)[0] if re.search(r":[0-9]+$", host) else host
                matches = bare.endswith(rule.prefix[1:].lower())
            else:
                matches = _under(name, rule.prefix)
            if matches and len(rule.prefix) > best_length:
                best, best_length = rule, len(rule.prefix)
        return best

    def candidates(self, ref):
        """[(Reference, rule or None)] in the order they are tried: one for a
        reference with a registry; one per unqualified-search registry for a
        short name when the files list some."""
        if ref.explicit_registry or self.search is None:
            return [(ref, self.rule_for(_full_name(ref.registry, ref.repository)))]
        if not self.search:
            raise BerthError(f"'{ref.uri}' names no registry and unqualified-search-registries "
                             f"is empty ({self.search_where}); write REGISTRY#IMAGE")
        out = []
        for host in self.search:
            repository = ref.name
            if host.lower() in _HUB_ALIASES and "/" not in repository:
                repository = f"library/{repository}"
            candidate = ref._replace(registry=host, repository=repository)
            out.append((candidate, self.rule_for(_full_name(host, repository))))
        return out

    def endpoints(self, ref):
        """[(Endpoint, Reference it answers for)] in the order to try, or
        Blocked naming the rule, before any request."""
        plan, blocked = [], []
        for candidate, rule in self.candidates(ref):
            if rule is not None and rule.blocked:
                blocked.append(f"{_full_name(candidate.registry, candidate.repository)} is "
                               f"blocked by the rule for '{rule.prefix}' ({rule.where})")
                continue
            plan.extend((endpoint, candidate) for endpoint in _rule_endpoints(candidate, rule))
        if not plan:
            raise Blocked("; ".join(blocked))
        return plan

    def describe(self, ref):
        """Lines for `berth import --dry-run`: each endpoint in order, and
        each blocked candidate."""
        lines = []
        for candidate, rule in self.candidates(ref):
            if rule is not None and rule.blocked:
                lines.append(f"blocked: {_full_name(candidate.registry, candidate.repository)} "
                             f"by the rule for '{rule.prefix}' ({rule.where})")
                continue
            for endpoint in _rule_endpoints(candidate, rule):
                scheme = "https, or http" if endpoint.insecure else "https"
                lines.append(f"{endpoint.name(candidate)} ({scheme}; {endpoint.what})")
        return lines


def _full_name(registry, repository):
    """HOST/PATH as the files name it: Docker Hub is docker.io."""
    host = HUB if registry.lower() in _HUB_ALIASES else registry
    if host == HUB and "/" not in repository:
        repository = f"library/{repository}"
    return f"{host}/{repository}"


def _under(name, prefix):
    """Whether `prefix` is `name` or a parent of it on a path boundary (the
    host compared without case)."""
    host, _, path = name.partition("/")
    prefix_host, _, prefix_path = prefix.partition("/")
    if host.lower() != prefix_host.lower():
        return False
    return not prefix_path or path == prefix_path or path.startswith(prefix_path + "/")


def _rule_endpoints(ref, rule):
    """The endpoints of `ref` under `rule`: mirrors (those that serve this
    kind of reference), then the location."""
    name = _full_name(ref.registry, ref.repository)
    if rule is None:
        return [Endpoint(*_connect(ref.registry, ref.repository), False, "no rule matches")]
    matched = name.split("/", 1)[0] if rule.wildcard else rule.prefix
    rest = name[len(matched):]
    by_digest = bool(ref.digest)
    out = []
    for number, mirror in enumerate(rule.mirrors, 1):
        mode = "digest-only" if rule.digest_only else mirror.pull_from
        if (mode == "digest-only" and not by_digest) or (mode == "tag-only" and by_digest):
            continue
        host, repository = _split_location(mirror.location + rest, mirror.where)
        out.append(Endpoint(*_connect(host, repository), mirror.insecure,
                            f"mirror {number} for '{rule.prefix}', {mirror.where}", True))
    location = name.split("/", 1)[0] if rule.wildcard else rule.location
    host, repository = _split_location(location + rest, rule.where)
    out.append(Endpoint(*_connect(host, repository), rule.insecure,
                        f"location for '{rule.prefix}', {rule.where}"))
    return out


def _connect(host, repository):
    """Where to connect for HOST: Docker Hub's API host for docker.io."""
    if host.lower() in _HUB_ALIASES:
        if "/" not in repository:
            repository = f"library/{repository}"
        return DEFAULT_REGISTRY, repository
    return host, repository


def _split_location(name, where):
    host, _, repository = name.partition("/")
    if not repository or not all(_COMPONENT.fullmatch(c) for c in repository.split("/")):
        raise BerthError(f"{where}: rewriting gives '{name}', which is not "
                         "HOST/REPOSITORY")
    return host, repository


# -- the files ---------------------------------------------------------------

def paths(sysconf):
    return [os.path.join(sysconf, FILE), *files_in(os.path.join(sysconf, DROPIN_DIR), ".conf")]


def load(sysconf):
    """The rules of the files under `sysconf` (ENROOT_SYSCONF_PATH)."""
    registries = Registries()
    for path in paths(sysconf):
        if os.path.isfile(path):
            _merge(registries, path)
    return registries


def _merge(registries, path):
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE + 1)
    except OSError as e:
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > _MAX_FILE:
        raise BerthError(f"{path}: larger than {_MAX_FILE >> 20} MiB; refusing it")
    try:
        text = raw.decode("utf-8")
        data = tomlread.loads(text)
    except UnicodeDecodeError:
        raise BerthError(f"{path}: not UTF-8 text") from None
    except tomlread.DecodeError as e:
        raise BerthError(f"{path}: not valid TOML: {e}") from None
    _add(registries, data, _Lines(path, text))


def check(data, lines):
    """The rules of `data`, a registries.conf's tables (the roles' variables
    among them), checked as a file's are: BerthError at the first problem,
    placed by `lines.at(scope, key)` (see _Lines)."""
    _add(Registries(), data, lines)


def _add(registries, data, lines):
    for key in data:
        if key not in _TOP_KEYS:
            raise _unsupported(lines, (), key)
    if "unqualified-search-registries" in data:
        value = data["unqualified-search-registries"]
        where = lines.at((), "unqualified-search-registries")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BerthError(f"{where}: unqualified-search-registries must be a list of "
                             "strings")
        for host in value:
            if not HOST.fullmatch(host):
                raise BerthError(f"{where}: unqualified-search registry '{host}' is not "
                                 "HOST[:PORT]")
        registries.search, registries.search_where = list(value), where
    tables = data.get("registry", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise BerthError(f"{lines.at((), 'registry')}: 'registry' must be [[registry]] tables")
    for index, table in enumerate(tables):
        rule = _rule(lines, index, table)
        # A later file's rule for the same prefix replaces the earlier one.
        registries.rules.pop(rule.prefix, None)
        registries.rules[rule.prefix] = rule


def _rule(lines, index, table):
    scope = ("registry", index)
    where = lines.at(scope, None)
    for key in table:
        if key not in _REGISTRY_KEYS:
            raise _unsupported(lines, scope, key)
    prefix = _string(lines, scope, table, "prefix")
    location = _string(lines, scope, table, "location")
    if prefix is None and location is None:
        raise BerthError(f"{where}: a [[registry]] needs a prefix or a location")
    if prefix is not None and prefix.startswith("*"):
        if not _WILDCARD.fullmatch(prefix):
            raise BerthError(f"{lines.at(scope, 'prefix')}: wildcard prefix '{prefix}' is not "
                             "*.DOMAIN (a host suffix, no path)")
        if location:
            raise BerthError(f"{lines.at(scope, 'location')}: a [[registry]] with the "
                             f"wildcard prefix '{prefix}' may not set a location")
    else:
        if prefix is not None:
            check_name(lines.at(scope, "prefix"), "prefix", prefix)
        if location is not None:
            check_name(lines.at(scope, "location"), "location", location)
    prefix = _canonical(prefix if prefix is not None else location)
    location = _canonical(location) if location else prefix
    mirrors = []
    entries = table.get("mirror", [])
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        raise BerthError(f"{lines.at(scope, 'mirror')}: 'mirror' must be [[registry.mirror]] "
                         "tables")
    for number, entry in enumerate(entries):
        mscope = ("registry", index, "mirror", number)
        for key in entry:
            if key not in _MIRROR_KEYS:
                raise _unsupported(lines, mscope, key)
        mirror_location = _string(lines, mscope, entry, "location")
        if not mirror_location:
            raise BerthError(f"{lines.at(mscope, None)}: a [[registry.mirror]] needs a "
                             "location")
        check_name(lines.at(mscope, "location"), "mirror location", mirror_location)
        pull_from = _string(lines, mscope, entry, "pull-from-mirror") or "all"
        if pull_from not in _PULL_FROM_MIRROR:
            raise BerthError(f"{lines.at(mscope, 'pull-from-mirror')}: pull-from-mirror must "
                             f"be one of {', '.join(_PULL_FROM_MIRROR)}, not '{pull_from}'")
        mirrors.append(_Mirror(_canonical(mirror_location),
                               _bool(lines, mscope, entry, "insecure"), pull_from,
                               lines.at(mscope, None)))
    return _Rule(prefix, location, _bool(lines, scope, table, "insecure"),
                 _bool(lines, scope, table, "blocked"),
                 _bool(lines, scope, table, "mirror-by-digest-only"), mirrors, where)


def _canonical(name):
    """HOST[/PATH] with the host in lower case, Docker Hub's as docker.io."""
    host, slash, path = name.partition("/")
    host = host.lower()
    if host in _HUB_ALIASES:
        host = HUB
    return f"{host}{slash}{path}"


def check_name(where, what, value):
    """HOST[:PORT][/PATH], as a prefix or location, or BerthError naming `where`."""
    host, _, path = value.partition("/")
    if not HOST.fullmatch(host):
        raise BerthError(f"{where}: {what} '{value}' does not start with HOST[:PORT]")
    if "@" in path or ":" in path:
        raise BerthError(f"{where}: {what} '{value}' names a tag or digest; berth supports "
                         "HOST[:PORT][/PATH] only")
    if path and not all(_COMPONENT.fullmatch(c) for c in path.split("/")):
        raise BerthError(f"{where}: {what} '{value}' has an invalid path (lowercase letters, "
                         "digits, '.', '_', '-' separated by '/')")


def _string(lines, scope, table, key):
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise BerthError(f"{lines.at(scope, key)}: {key} must be a string")
    return value


def _bool(lines, scope, table, key):
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise BerthError(f"{lines.at(scope, key)}: {key} must be true or false")
    return value


def _unsupported(lines, scope, key):
    why = _UNSUPPORTED.get(key, "berth does not support it")
    table = {0: "", 2: "[[registry]] ", 4: "[[registry.mirror]] "}[len(scope)]
    return BerthError(f"{lines.at(scope, key)}: unsupported {table}key '{key}': {why}")


class _Lines:
    """Line numbers of tables and keys, found by scanning the text (tomllib
    gives none): scopes are () for the top level, ("registry", i) for the
    i-th [[registry]], ("registry", i, "mirror", j) for its j-th mirror."""

    _HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(?:#.*)?$")
    _KEY = re.compile(r"\s*([\"']?)([A-Za-z0-9_-]+)\1\s*[=.]")

    def __init__(self, path, text):
        self.path = path
        self.first = {}  # (scope, key or None) -> line number
        self.anywhere = {}  # key -> first line that sets it, in any table
        scope, registry, mirror = (), -1, -1
        for number, line in enumerate(text.splitlines(), 1):
            header = self._HEADER.match(line)
            if header:
                name = header.group(2).replace(" ", "")
                if name == "registry" and header.group(1) == "[[":
                    registry, mirror = registry + 1, -1
                    scope = ("registry", registry)
                elif name == "registry.mirror" and header.group(1) == "[[":
                    mirror += 1
                    scope = ("registry", registry, "mirror", mirror)
                else:
                    scope = ("table", name.split(".")[0])
                    self.first.setdefault(((), name.split(".")[0]), number)
                self.first.setdefault((scope, None), number)
                continue
            key = self._KEY.match(line)
            if key:
                self.first.setdefault((scope, key.group(2)), number)
                self.anywhere.setdefault(key.group(2), number)
                # A [[registry]] may hold its mirrors inline: mirror = [{...}].
                for inner in re.findall(r"[{,]\s*([A-Za-z0-9_-]+)\s*=", line):
                    self.anywhere.setdefault(inner, number)

    def at(self, scope, key):
        """FILE:LINE of `key` in `scope` (or of the scope itself), as near as found."""
        if key is not None:
            number = self.first.get((scope, key)) or self.anywhere.get(key)
            if number:
                return f"{self.path}:{number}"
        number = self.first.get((scope, None))
        return f"{self.path}:{number}" if number else self.path
