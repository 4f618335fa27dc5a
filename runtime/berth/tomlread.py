"""TOML text, read: the standard library's tomllib (tomli before Python 3.11),
with nesting deeper than the parser can recurse, keys of more parts than it
reads in reasonable time and integers longer than Python converts refused
as bad TOML."""

import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DecodeError = tomllib.TOMLDecodeError

#: The parts a dotted key may have: tomllib's time grows with the square of
#: a key's parts (a key of 100,000 parts reads for minutes).
MAX_KEY_PARTS = 100

# Strings and comments, whose dots are no key's. An unterminated one runs to
# the end of its line or of the text (such TOML is refused anyway), so that
# no text is matched twice: linear time whatever the text.
_STRING_OR_COMMENT = re.compile(
    r'"""(?:[^"\\]|\\.|"(?!""))*(?:""")?'
    r"|'''(?:[^']|'(?!''))*(?:''')?"
    r'|"(?:[^"\\\n]|\\.)*"?'
    r"|'[^'\n]*'?"
    r"|#[^\n]*", re.DOTALL)


def loads(text):
    """The table `text` holds; DecodeError for anything that is not TOML
    Berth can read. tomllib recurses once per nesting level: arrays or
    inline tables a few hundred deep end in a RecursionError otherwise."""
    _check_key_parts(text)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise DecodeError("arrays or inline tables nested too deeply") from None
    except DecodeError:
        raise
    except ValueError:  # int()'s limit of digits
        raise DecodeError("an integer of more than 4300 digits") from None


def _check_key_parts(text):
    """DecodeError, before any parsing, for a line of MAX_KEY_PARTS dots or
    more outside strings and comments (a key of more than MAX_KEY_PARTS
    parts has that many)."""
    bare = _STRING_OR_COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    for number, line in enumerate(bare.split("\n"), 1):
        if line.count(".") >= MAX_KEY_PARTS:
            raise DecodeError(f"a key of more than {MAX_KEY_PARTS} dotted parts "
                              f"(at line {number}, column 1)")
