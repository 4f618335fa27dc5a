"""Which files of the build context COPY and ADD never see: the patterns
of an ignore file, as BuildKit reads them (Go's filepath.Match per path
component plus `**`, `!` exceptions, `#` comments, each pattern cleaned
and its leading `/` dropped; the last pattern that matches a path or one
of its parents wins).

The file is the first of FILE.dockerignore beside the Containerfile (as
BuildKit, for `-f FILE`), the context's .containerignore (podman and
buildah's name) and its .dockerignore. The matching is the
`e2b-dockerfile-utils` package's port of moby/patternmatcher (the one
Docker's CLI and BuildKit use), taken over docker-py's matcher (which
reads Go's negated class `[^a]` as `[\\^a]` and does not honour a `\\`
escape) and pathspec (git's rules: `*` crosses no `/`, but a pattern
without `/` matches at any depth, which Docker's does not)."""

import os
import stat
import typing

from berth.errors import BerthError

NAMES = (".containerignore", ".dockerignore")


class Ignore(typing.NamedTuple):
    file: str       # the ignore file, for messages
    matcher: object  # e2b_dockerfile_utils.PatternMatcher

    def excludes(self, name):
        """Whether `name` (relative to the context, '/'-separated) is left out."""
        return self.matcher.matches(name)

    def may_keep_under(self, name):
        """Whether an exception may keep something below the excluded `name`."""
        return self.matcher.may_match_under(name)


def _read(path):
    """The text of the ignore file `path`, never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise BerthError(f"{path}: cannot read the ignore file: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise BerthError(f"{path}: the ignore file is not a regular file")
        data = f.read()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise BerthError(f"{path}: the ignore file is not UTF-8 text") from None


def load(path):
    """The Ignore of the file `path`; a bad pattern in one line naming its line."""
    try:
        from e2b_dockerfile_utils import PatternMatcher
    except ImportError:
        raise BerthError(f"{path}: reading it needs the Python package 'e2b-dockerfile-utils'"
                         ": install berth[build] (Python 3.11 or later; the container_runtime "
                         "role does, with container_runtime_build: true)") from None
    lines = _read(path).splitlines()
    for number, line in enumerate(lines, 1):
        try:
            PatternMatcher([line])
        except ValueError as e:
            raise BerthError(f"{path}:{number}: {e}") from None
    return Ignore(file=path, matcher=PatternMatcher(lines))


def find(context, containerfile):
    """The Ignore of the build, or None where no ignore file is there."""
    for path in (f"{containerfile}.dockerignore", *(os.path.join(context, n) for n in NAMES)):
        if os.path.lexists(path):
            return load(path)
    return None
