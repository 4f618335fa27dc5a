"""What the benchmarks read of running processes: the resident memory of a
process tree (a build's or an import's, with every helper it started)."""

import os


def _parents():
    """{pid: its parent's pid} of every process now."""
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # (it ended while we looked)
    return parents


def tree_rss(roots):
    """The resident bytes now of the processes `roots` and all their descendants."""
    parents = _parents()
    family, grown = set(roots), True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grown = bool(more)
    total = 0
    for pid in family:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total
