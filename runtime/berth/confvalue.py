"""An enroot.conf value read the way enroot's shell reads it, with no shell.

enroot hands every value to `eval echo`, so sites write shell: quotes,
`$VAR`, `${VAR}`, `${VAR:-word}`, `~/`, `$(id -u)`. This reads the part of
that language sites use and refuses the rest, one line saying what:

- words split on unquoted blanks, joined by one space (echo's output); an
  unquoted `#` that starts a word ends the value;
- `'...'` is literal; `"..."` keeps its blanks and expands `$` forms;
  a backslash quotes the next character (in `"..."`, only `$ " \\` and the
  backquote);
- `$NAME` and `${NAME}`, `${NAME:-word}` (word when unset or empty) and
  `${NAME-word}` (word when unset), from the scope the caller gives;
- `~` alone or before `/`, at the start of a word: `$HOME`;
- the commands in COMMANDS, answered here: `$(id -u)`, `$(nproc)`, ...

A variable's value is text, never read again: whatever a user puts in the
environment cannot become a command, a quote or a glob. Its blanks split
words as the shell's do. A value naming an unset variable has no value at
all: enroot's shell (`set -u`) fails on it, and enroot then keeps the
key's default; read() returns None for it.
"""

import os
import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Unquoted, each would make the shell run, redirect or glob something.
_REFUSED = {";": "a command separator", "&": "a command separator", "|": "a pipe",
            "<": "a redirection", ">": "a redirection", "(": "a subshell", ")": "a subshell",
            "*": "a glob", "?": "a glob", "[": "a glob",
            "{": "a brace expansion"}


def _user_name():
    import pwd
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _group_name():
    import grp
    try:
        return grp.getgrgid(os.getegid()).gr_name
    except KeyError:
        return str(os.getegid())


#: The commands a value may run, each answered from the process itself
#: (never from the environment): enroot.conf's own `$(nproc)` and the
#: per-user and per-group paths sites write.
COMMANDS = {
    ("id", "-u"): lambda: str(os.geteuid()),
    ("id", "-g"): lambda: str(os.getegid()),
    ("id", "-un"): _user_name,
    ("id", "-nu"): _user_name,
    ("whoami",): _user_name,
    ("id", "-gn"): _group_name,
    ("id", "-ng"): _group_name,
    ("nproc",): lambda: str(len(os.sched_getaffinity(0))),
}


class Refused(ValueError):
    """A value in a form this reader does not take; the message says which."""


class _Unset(Exception):
    """The value names an unset variable."""


class _Words:
    """echo's arguments as they are built: a word exists once it has text
    or a quote (`""` is an empty word; an empty `$VAR` is none)."""

    def __init__(self):
        self.done = []
        self.text = []
        self.started = False

    def add(self, text, started=True):
        self.text.append(text)
        self.started = self.started or started or bool(text)

    def add_split(self, text):
        """An unquoted expansion's text, split on blanks."""
        first, *rest = re.split(r"[ \t\n]+", text)
        self.add(first, started=False)
        for field in rest:
            self.end()
            self.add(field, started=False)

    def end(self):
        if self.started:
            self.done.append("".join(self.text))
        self.text, self.started = [], False


class _Reader:
    """One value, read once from left to right (`at` the next character)."""

    def __init__(self, text, scope):
        self.text = text
        self.scope = scope
        self.at = 0

    def peek(self, offset=0):
        index = self.at + offset
        return self.text[index] if index < len(self.text) else ""

    def words(self):
        words = _Words()
        while self.at < len(self.text):
            char = self.peek()
            if char in " \t":
                words.end()
                self.at += 1
            elif char == "#" and not words.text:
                break
            else:
                self.word_part(words)
        words.end()
        return words.done

    def word_part(self, words):
        char = self.peek()
        if char == "'":
            end = self.text.find("'", self.at + 1)
            if end < 0:
                raise Refused("a ' quote is not closed")
            words.add(self.text[self.at + 1:end])
            self.at = end + 1
        elif char == '"':
            self.at += 1
            words.add(self.double_quoted())
        elif char == "\\":
            if not self.peek(1):
                raise Refused("a \\ ends the value")
            words.add(self.peek(1))
            self.at += 2
        elif char == "$":
            words.add_split(self.dollar())
        elif char == "~" and not words.text:
            words.add(self.tilde())
        elif char == "`":
            raise _backquote()
        elif char in _REFUSED:
            raise Refused(f"'{char}' is {_REFUSED[char]} to enroot's shell; quote it")
        else:
            words.add(char)
            self.at += 1

    def double_quoted(self):
        parts = []
        while True:
            char = self.peek()
            if not char:
                raise Refused('a " quote is not closed')
            if char == '"':
                self.at += 1
                return "".join(parts)
            if char == "\\" and self.peek(1) in ('$', '"', "\\", "`"):
                parts.append(self.peek(1))
                self.at += 2
            elif char == "$":
                parts.append(self.dollar())
            elif char == "`":
                raise _backquote()
            else:
                parts.append(char)
                self.at += 1

    def tilde(self):
        after = self.peek(1)
        if after not in ("", "/", " ", "\t"):
            raise Refused("only ~ and ~/ are read, not ~NAME")
        self.at += 1
        home = self.scope.get("HOME")
        return home if home is not None else os.path.expanduser("~")

    def dollar(self):
        after = self.peek(1)
        if after == "{":
            return self.braced()
        if after == "(":
            return self.command()
        found = _NAME.match(self.text, self.at + 1)
        if found:
            self.at = found.end()
            return self.variable(found.group())
        if after and after in "'\"$?#@*!-0123456789":
            raise Refused(f"'${after}' is not read: only $NAME, ${{NAME}}, ${{NAME:-word}}, "
                          "${NAME-word} and $(...) are")
        self.at += 1
        return "$"

    def variable(self, name):
        value = self.scope.get(name)
        if value is None:
            raise _Unset(name)
        return value

    def braced(self):
        found = _NAME.match(self.text, self.at + 2)
        if not found:
            raise Refused("'${' is not followed by a variable's name")
        self.at = found.end()
        name, value = found.group(), self.scope.get(found.group())
        for operator, when in ((":-", lambda v: not v), ("-", lambda v: v is None)):
            if self.text.startswith(operator, self.at):
                self.at += len(operator)
                word = self.default_word()
                return word if when(value) else value
        if self.peek() != "}":
            raise Refused(f"'${{{name}' is not read: only ${{NAME}}, ${{NAME:-word}} and "
                          "${NAME-word} are")
        self.at += 1
        return self.variable(name)

    def default_word(self):
        """The word of ${NAME:-word}, to its closing brace: text, `$`
        forms and a leading `~`; quotes, globs and the rest are refused."""
        parts = []
        if self.peek() == "~":
            parts.append(self.tilde())
        while self.peek() != "}":
            char = self.peek()
            if not char:
                raise Refused("a '${' is not closed")
            if char == "$":
                parts.append(self.dollar())
            elif char in _REFUSED or char in "'\"\\":
                raise Refused(f"'{char}' inside ${{...}} is not read")
            else:
                parts.append(char)
                self.at += 1
        self.at += 1
        return "".join(parts)

    def command(self):
        end = self.text.find(")", self.at + 2)
        if end < 0:
            raise Refused("a '$(' is not closed")
        argv = tuple(self.text[self.at + 2:end].split())
        if argv not in COMMANDS:
            shown = self.text[self.at:end + 1]
            raise Refused(f"'{shown}' is not read: of commands, only {_LISTED} are")
        self.at = end + 1
        return COMMANDS[argv]()


_LISTED = "$(id -u), $(id -g), $(id -un), $(id -gn), $(whoami) and $(nproc)"


def _backquote():
    return Refused(f"'`' is a command substitution, which is not read: of commands, only "
                   f"{_LISTED} are")


def read(text, scope):
    """The value `text` reads as (echo's output), expanding from `scope`
    (a mapping of variables); None when it names an unset variable.
    Refused says why a value cannot be read."""
    try:
        words = _Reader(text, scope).words()
    except _Unset:
        return None
    if words and re.fullmatch(r"-[neE]+", words[0]):
        raise Refused(f"'{words[0]}' as the first word is an option to enroot's echo, "
                      "which prints no such value")
    return " ".join(words)
