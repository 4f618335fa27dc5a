"""`berth store serve | list | prune`: serve is the store's side
(service.py); `berth store list` shows the entries, reading only; `berth
store prune` (prune.py) removes the least recently used, as the store's
account.
"""

import collections
import contextlib
import json
import os

from berth.image.cachelayout import LAYERS_LINK
from berth.image.cachescan import CacheDirs, open_followed, scan
from berth.store import service
from berth.store.paths import configured_path, entry_line, source

# `berth store serve | list [--json] | prune OPTIONS` (cli.py makes it of the
# command line)
StoreRequest = collections.namedtuple(
    "StoreRequest", "store_verb json older_than max_size dry_run quiet",
    defaults=(False, None, None, False, False))


def cmd_store(request, cfg):
    if request.store_verb == "serve":
        return service.serve(cfg)
    if request.store_verb == "prune":
        from berth.store import prune
        return prune.cmd_prune(request, cfg)
    return _list(cfg, request.json)


def _list(cfg, as_json):
    """One line per entry, least recently used first: size, last use, the
    URI it was imported from (image.json's source; "(older)" when the
    store's latest for that URI is another entry), path. As JSON (for
    programs: the berth_store_image module): a list, in the same order, of
    {"path", "size" (bytes), "used" (seconds since the epoch), "source",
    "latest"}."""
    store = configured_path(cfg)
    uris = os.path.join(store, "uris")
    latest = set()
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(uris):
            if name.startswith(LAYERS_LINK):  # a record of layers, not of a URI
                continue
            with contextlib.suppress(OSError):
                latest.add(os.path.basename(os.readlink(os.path.join(uris, name))))
    # The scan prune takes its order from: one meaning of "last use".
    with CacheDirs(store, open_followed(store), strict=False) as dirs:
        found = [entry for entry in scan(dirs) if entry.kind == "images"]
    if as_json:
        print(json.dumps([{"path": entry.path, "size": entry.size, "used": int(entry.used),
                           "source": source(entry.path), "latest": entry.name in latest}
                          for entry in found], indent=1))
        return 0
    for entry in found:
        older = "" if entry.name in latest else " (older)"
        print(entry_line(entry, f"{source(entry.path)}{older}"))
    return 0
