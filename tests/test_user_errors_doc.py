"""Every message docs/user/errors.md quotes is one the code prints: each
literal run of a quoted message (what lies between its placeholders) stands
in the plugin's C, the runtime's Python or a hook, or is named below as
another program's words. A message reworded in the code and not on the page,
or a page quoting one nobody prints, fails here."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "user" / "errors.md"
SOURCES = [*ROOT.glob("spank/*.c"), *ROOT.glob("runtime/berth/**/*.py"), *ROOT.glob("hooks/*.sh")]

# What the code fills in at run time, which the page writes as a
# placeholder or an example: numbers, times, paths, quoted names, flags,
# a namespace's kind, the runtime command that failed.
PLACEHOLDER = re.compile(
    r"\.\.\.|\b(?:IMAGE|REASON|NAME|URI|LINE|R|REPOSITORY|PATH|DIR|N|HH:MM:SS)\b|/home/u/\S+|'[^']*'|sha256:"
    r"|\d+(?:\.\d+)?|nvcr\.io#nvidia/x|--[a-z-]+(?:=[a-z]+)?|PYXIS_[A-Z_]+|\.\./\S+"
    r"|\w+(?= namespace)|berth (?:start|import)(?= failed)")
# The loggers' prefixes, written once in the code and before every line
# (report_failure names the runtime command whose line follows).
PREFIXES = ("spank_berth: warning: ", "spank_berth: berth import: ", "spank_berth: ",
            "berth: error: ", "berth: ")
# Text that other programs print, quoted because users see it beside Berth's.
OTHERS = {
    "Invalid cross-device link": "strerror(EXDEV)",
    "Too Many Requests": "the registry's HTTP reason phrase",
    "Name or service not known": "getaddrinfo's gai_strerror",
    "hostname: you must be root": "busybox's hostname applet",
    "Read-only file system": "strerror(EROFS)",
    "No such file or directory": "strerror(ENOENT)",
}
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_']*")


def _quoted_messages():
    """The backquoted spans of each table row's first cell."""
    for line in PAGE.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| message") \
                and not line.startswith("| ---"):
            yield from re.findall(r"`([^`]+)`", line.split(" | ")[0])


def _runs(message):
    """The word runs of `message` the code must hold, each as a tuple of
    words: what lies between its placeholders, past its logger's prefix."""
    message = next((message[len(p):] for p in PREFIXES if message.startswith(p)), message)
    for words in OTHERS:
        message = message.replace(words, "...")
    return [tuple(WORD.findall(run)) for run in PLACEHOLDER.split(message) if WORD.search(run)]


def _ngrams(words, n):
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@pytest.fixture(scope="module")
def code():
    """Every run of one to three words in the sources: a C string that goes
    on over two lines, or an f-string's text around a {value}, reads on."""
    text = "\n".join(path.read_text(errors="replace") for path in SOURCES)
    text = re.sub(r"\{[^{}\n]*\}|%[-.*0-9l]*[a-z]", " ", text)
    words = WORD.findall(text)
    return set().union(*(_ngrams(words, n) for n in (1, 2, 3)))


def test_the_page_quotes_messages():
    assert len(list(_quoted_messages())) >= 20


@pytest.mark.parametrize("message", sorted(set(_quoted_messages())))
def test_each_quoted_message_is_printed_by_the_code(message, code):
    missing = [" ".join(run) for run in _runs(message)
               if not (_ngrams(list(run), min(3, len(run))) <= code)]
    assert not missing, f"errors.md quotes {message!r}; no source prints {missing}"


def test_a_reworded_message_is_found_out(code):
    """The check itself: a message no source prints fails it."""
    run, = _runs("spank_berth: berth start went sideways: ...")
    assert not _ngrams(list(run), 3) <= code
