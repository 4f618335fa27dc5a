"""A Containerfile read into its instructions, by BuildKit's own parser.

The parser is the `dockerfile` package (asottile's binding of BuildKit's
Go parser, github.com/moby/buildkit/frontend/dockerfile/parser), taken over
Red Hat's pure-Python `dockerfile-parse`: that one reads `RUN <<EOF` as a
RUN of "<<EOF" followed by an instruction per line of the heredoc, while
BuildKit's parser gives the heredoc's text with its instruction, and reads
the `escape` directive, line continuations and the comments between them
exactly as `docker build` does. It ships one abi3 wheel for every CPython
from 3.9 on; parse.py imports it only when a build runs.
"""

import re
import typing

from berth.errors import BerthError

# BuildKit's own frontends: what a `# syntax=` directive may name here.
_SYNTAX = re.compile(r"(docker\.io/)?docker/dockerfile(-upstream)?(:[0-9a-z.\-]+)?"
                     r"(@sha256:[0-9a-f]{64})?")
_DIRECTIVE = re.compile(r"#\s*([a-zA-Z]+)\s*=\s*(\S*)\s*")


class Heredoc(typing.NamedTuple):
    name: str
    content: str


class Instruction(typing.NamedTuple):
    """One instruction as BuildKit's parser gives it; `where` is FILE:LINE."""

    cmd: str            # upper case: RUN, COPY, ...
    flags: tuple        # ("--from=base", ...)
    value: tuple        # its arguments, as the parser splits them
    json: bool          # the exec (JSON) form
    heredocs: tuple     # Heredoc values
    original: str       # the instruction's text, continuations joined
    where: str
    sub_cmd: str = None  # ONBUILD's instruction


class Containerfile(typing.NamedTuple):
    path: str
    escape: str
    instructions: list


def _directives(path, text):
    """The escape character, after checking the parser directives (the
    leading comment lines of KEY=VALUE) that BuildKit reads."""
    escape = "\\"
    for number, line in enumerate(text.splitlines(), 1):
        found = _DIRECTIVE.fullmatch(line)
        if not found:
            break
        key, value = found[1].lower(), found[2]
        if key == "syntax" and not _SYNTAX.fullmatch(value):
            raise BerthError(f"{path}:{number}: syntax directive '{value}': berth build reads "
                             "the Dockerfile language itself and takes no other frontend")
        if key == "escape":
            escape = value
    return escape


def read(path):
    """The Containerfile at `path`, parsed; a bad file in one line naming it."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BerthError(f"{path}: not UTF-8 text") from None
    escape = _directives(path, text)
    return Containerfile(path=path, escape=escape, instructions=_parsed(text, path=path))


def _parsed(text, *, path, where=None):
    """The Instructions of `text`, each at `where`, else at its line of `path`."""
    try:
        import dockerfile
    except ImportError:
        raise BerthError("berth build needs the Python package 'dockerfile' (BuildKit's "
                         "parser): install berth[build] (the container_runtime role does, "
                         "with container_runtime_build: true)") from None
    try:
        commands = dockerfile.parse_string(text)
    except dockerfile.GoParseError as e:
        raise BerthError(f"{where or path}: {e}") from None
    return [Instruction(cmd=c.cmd.upper(), flags=tuple(c.flags), value=tuple(c.value),
                        json=c.json, original=c.original, where=where or f"{path}:{c.start_line}",
                        heredocs=tuple(Heredoc(h.name, h.content) for h in c.heredocs),
                        sub_cmd=c.sub_cmd)
            for c in commands]


def trigger(text, where):
    """The Instruction of an ONBUILD trigger's `text`, at `where` (the FROM
    line whose image recorded it)."""
    found = _parsed(text, path=None, where=where)
    if len(found) != 1:
        raise BerthError(f"{where}: the base image's ONBUILD trigger {text!r} is not one "
                         "instruction")
    return found[0]
