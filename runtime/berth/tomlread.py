"""TOML text, read: the standard library's tomllib (tomli before Python 3.11),
with nesting deeper than the parser can recurse refused as bad TOML."""

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DecodeError = tomllib.TOMLDecodeError


def loads(text):
    """The table `text` holds; DecodeError for anything that is not TOML
    Berth can read. tomllib recurses once per nesting level: arrays or
    inline tables a few hundred deep end in a RecursionError otherwise."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise DecodeError("arrays or inline tables nested too deeply") from None
