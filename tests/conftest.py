"""Settings of the whole pytest session (tests/ and runtime/tests)."""

# Files whose tests take minutes each, mostly waiting on a Slurm in a
# container. Collected first, so that `pytest -n 2 --dist loadfile
# --no-loadscope-reorder` (scripts/test.sh) starts them on one worker while
# the other works through the short tests, instead of ending with them alone.
LONGEST_FIRST = ("test_spank_e2e.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest in order
