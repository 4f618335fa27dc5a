"""BuildKit's word processing of an instruction's arguments: quotes,
escapes and $VAR, ${VAR}, ${VAR:-WORD}, ${VAR-WORD}, ${VAR:+WORD} and
${VAR+WORD}, expanded from the build's variables. The file's tokens come
from BuildKit's parser (parse.py); this is the step it leaves to the
instruction, applied to ADD, COPY, ENV, EXPOSE, FROM, LABEL, STOPSIGNAL,
USER, VOLUME and WORKDIR, never to RUN, CMD and ENTRYPOINT (their shell
does it)."""

import re

from berth.errors import BerthError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":+", "-", "+")


class _Reader:
    """One pass over `text`: the words it makes, split at unquoted blanks."""

    __slots__ = ("text", "at", "env", "escape", "where")

    def __init__(self, text, *, env, escape, where):
        self.text, self.at, self.env, self.escape, self.where = text, 0, env, escape, where

    def fail(self, why):
        raise BerthError(f"{self.where}: {why} in '{self.text}'")

    def words(self, split=True, stop=None):
        """The words up to the end (or up to `stop`, an unquoted '}')."""
        words, current, started = [], [], False
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == stop:
                break
            self.at += 1
            if split and char in " \t\n":
                if started:
                    words.append("".join(current))
                current, started = [], False
                continue
            started = True
            if char == self.escape:
                if self.at < len(self.text):
                    current.append(self.text[self.at])
                    self.at += 1
            elif char == "'":
                current.append(self._until("'"))
            elif char == '"':
                current.append(self._double_quoted())
            elif char == "$":
                current.append(self._variable())
            else:
                current.append(char)
        if started:
            words.append("".join(current))
        return words

    def _until(self, end):
        closing = self.text.find(end, self.at)
        if closing < 0:
            self.fail("unterminated quote")
        value, self.at = self.text[self.at:closing], closing + 1
        return value

    def _double_quoted(self):
        value = []
        while self.at < len(self.text):
            char = self.text[self.at]
            self.at += 1
            if char == '"':
                return "".join(value)
            if char == self.escape and self.at < len(self.text) \
                    and self.text[self.at] in f'"$\n{self.escape}':
                value.append(self.text[self.at])
                self.at += 1
            elif char == "$":
                value.append(self._variable())
            else:
                value.append(char)
        return self.fail("unterminated quote")

    def _variable(self):
        if self.text.startswith("{", self.at):
            return self._braced()
        name = _NAME.match(self.text, self.at)
        if not name:
            return "$"
        self.at = name.end()
        return self.env.get(name[0], "")

    def _braced(self):
        name = _NAME.match(self.text, self.at + 1)
        if not name:
            self.fail("bad substitution")
        self.at = name.end()
        operator = next((op for op in _OPERATORS if self.text.startswith(op, self.at)), None)
        if operator is None:
            if not self.text.startswith("}", self.at):
                self.fail("unsupported substitution (only :-, -, :+ and +)")
            self.at += 1
            return self.env.get(name[0], "")
        self.at += len(operator)
        word = "".join(self.words(split=False, stop="}"))
        if not self.text.startswith("}", self.at):
            self.fail("unterminated ${")
        self.at += 1
        value = self.env.get(name[0])
        is_set = value is not None and (value != "" or ":" not in operator)
        if operator.endswith("-"):
            return value if is_set else word
        return word if is_set else ""


def split(text, *, env, where, escape="\\"):
    """The words of `text`, each with its quotes removed and variables expanded."""
    return _Reader(text, env=env, escape=escape, where=where).words()


def one(text, *, env, where, escape="\\"):
    """`text` as one word (blanks kept), quotes removed and variables expanded."""
    return "".join(_Reader(text, env=env, escape=escape, where=where).words(split=False))
