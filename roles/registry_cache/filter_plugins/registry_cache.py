"""Checks of the registry_cache role's variables, one message per problem,
each naming the variable, so the play can refuse bad input before any host
changes. registry_cache_max_size is a size as berth's --max-size takes it:
runtime/berth/units.py of this checkout, loaded alone, is its one grammar
(as plugins/filter/berth_units.py loads it)."""

import importlib.util
import re
from pathlib import Path

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_PREFIX = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}(?::[0-9]{{1,5}})?"
                     r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_URL = re.compile(rf"https?://(?:{_LABEL}\.)*{_LABEL}(?::[0-9]{{1,5}})?/?")
_KEYS = {"name", "prefix", "remoteurl", "port", "username", "password"}
_SPEC = importlib.util.spec_from_file_location(
    "berth_units_of_the_runtime", Path(__file__).resolve().parents[3] / "runtime/berth/units.py")
units = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(units)


def _taken(what, first):
    """The problem of `what` (an upstream's key and value) that the upstream
    at index `first` has already."""
    return f"{what} is also registry_cache_upstreams[{first}]'s"


def registry_cache_problems(upstreams, max_size="", certificate="", key="",
                            unprivileged_port_start=None):
    """The problems of registry_cache_upstreams and the knobs beside it.
    unprivileged_port_start: the cache host's lowest port any user may bind
    (net.ipv4.ip_unprivileged_port_start), or None where it was not read.
    Served as plain HTTP, the cache must listen below it: the nodes trust
    whatever answers there, and a user of the cache host could bind an
    unprivileged port while the instance restarts (its size timer stops and
    starts it) and answer their pulls with her own images. With TLS the
    certificate is what the nodes trust, and any port will do."""
    problems = []
    if not isinstance(upstreams, list):
        return ["registry_cache_upstreams: expected a list of upstreams"]
    names, ports = {}, {}
    for index, upstream in enumerate(upstreams):
        where = f"registry_cache_upstreams[{index}]"
        if not isinstance(upstream, dict):
            problems.append(f"{where}: expected a mapping with name, prefix, remoteurl and port")
            continue
        for unknown in sorted(set(upstream) - _KEYS):
            problems.append(f"{where}: unknown key '{unknown}' (known: {', '.join(sorted(_KEYS))})")
        name, prefix = upstream.get("name"), upstream.get("prefix")
        url, port = upstream.get("remoteurl"), upstream.get("port")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(f"{where}.name: {name!r} is not [a-z0-9][a-z0-9-]* (at most 63)")
        elif name in names:
            problems.append(_taken(f"{where}.name: '{name}'", names[name]))
        else:
            names[name] = index
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            problems.append(f"{where}.prefix: {prefix!r} is not a registry name HOST[:PORT][/PATH]")
        if not isinstance(url, str) or not _URL.fullmatch(url):
            problems.append(f"{where}.remoteurl: {url!r} is not http(s)://HOST[:PORT]")
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            problems.append(f"{where}.port: {port!r} is not a TCP port (1-65535)")
        elif port in ports:
            problems.append(_taken(f"{where}.port: {port}", ports[port]))
        else:
            ports[port] = index
            if unprivileged_port_start is not None and not certificate \
                    and port >= unprivileged_port_start:
                problems.append(
                    f"{where}.port: {port} may be bound by any user of this host "
                    f"(net.ipv4.ip_unprivileged_port_start is {unprivileged_port_start}), and the "
                    "cache serves plain HTTP: one could answer the nodes' pulls while the cache "
                    f"restarts; use a port below {unprivileged_port_start}, or set "
                    "registry_cache_tls_certificate and registry_cache_tls_key")
        if ("username" in upstream) != ("password" in upstream):
            problems.append(f"{where}: give both username and password, or neither")
    if max_size not in ("", None) and units.size(str(max_size)) is None:
        problems.append(
            f"registry_cache_max_size: {max_size!r} is not bytes or a size such as 200G")
    if bool(certificate) != bool(key):
        problems.append(
            "registry_cache_tls_certificate, registry_cache_tls_key: set both or neither")
    return problems


def registry_cache_bytes(size):
    """'200G' -> bytes (powers of 1024); '' -> 0."""
    value = units.size(str(size or "0"))
    if value is None:
        raise ValueError(f"registry_cache_max_size: {size!r} is not bytes or a size such as 200G")
    return value


class FilterModule:
    def filters(self):
        return {
            "registry_cache_problems": registry_cache_problems,
            "registry_cache_bytes": registry_cache_bytes,
        }
