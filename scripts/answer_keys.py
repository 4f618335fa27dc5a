"""Write spank/answer_keys.h, the plugin's table of the runtime's --porcelain
keys, from their one table, runtime/berth/porcelain.py's KEYS.
  python scripts/answer_keys.py           write it
  python scripts/answer_keys.py --check   exit 1 when it is out of date"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "spank/answer_keys.h"
sys.path.insert(0, str(ROOT / "runtime"))

from berth import porcelain  # noqa: E402 (the checkout's runtime, not an installed one)


def header():
    lines = ["/*",
             " * The runtime's --porcelain keys, one ANSWER_KEY(key, kind) a line:",
             " * written by scripts/answer_keys.py from their one table,",
             " * runtime/berth/porcelain.py's KEYS (do not edit). answer.h makes",
             " * struct answer's fields of it and answer.c its parser. No include",
             " * guard: each user defines ANSWER_KEY and includes it.",
             " */"]
    for key, (kind, said) in porcelain.KEYS.items():
        lines += [f"/* {said} */", f"ANSWER_KEY({key}, {kind})"]
    return "\n".join(lines) + "\n"


def main(argv):
    if argv not in ([], ["--check"]):
        print("usage: python scripts/answer_keys.py [--check]", file=sys.stderr)
        return 2
    if argv == ["--check"]:
        if HEADER.read_text() != header():
            print(f"{HEADER.relative_to(ROOT)} is out of date: python scripts/answer_keys.py")
            return 1
        return 0
    HEADER.write_text(header())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
