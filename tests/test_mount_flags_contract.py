"""Contract: the mount flags the SPANK plugin lets through at submission
(spank/options.c, known_mount_flag) are flags `berth start -m` takes
(runtime/berth/mounts.py FLAGS), so no job passes srun and then fails on the
node over a flag. The plugin may know fewer (it then refuses early)."""

import re
from pathlib import Path

from berth import mounts

REPO = Path(__file__).resolve().parent.parent


def plugin_flags():
    source = (REPO / "spank/options.c").read_text()
    body = re.search(r"known_mount_flag\(.*?\{(.*?)\n\}", source, re.S).group(1)
    table = re.search(r"known\[\]\s*=\s*\{(.*?)\};", body, re.S).group(1)
    return set(re.findall(r'"([^"]+)"', table))


def test_every_flag_the_plugin_accepts_is_one_berth_start_takes():
    flags = plugin_flags()
    assert {"ro", "rbind", "rprivate"} <= flags  # the table was found
    assert flags - mounts.FLAGS == set()
    for flag in flags:  # and as a -m spec, not only in the table
        assert flag in mounts.parse_spec(f"/src:/dst:{flag}").options
