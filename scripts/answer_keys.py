"""Write spank/answer_keys.h, the plugin's table of the runtime's --porcelain
keys, and spank/answer_status.h, the exit statuses it tells apart, from
their one table each, runtime/berth/porcelain.py's KEYS and STATUSES.
  python scripts/answer_keys.py           write them
  python scripts/answer_keys.py --check   exit 1 when one is out of date"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "spank/answer_keys.h"
STATUS_HEADER = ROOT / "spank/answer_status.h"
sys.path.insert(0, str(ROOT / "runtime"))

from berth import porcelain  # noqa: E402 (the checkout's runtime, not an installed one)


def c_header(comment, body):
    """A generated C header: `comment`'s lines in one comment, then `body`'s."""
    return "\n".join(["/*", *(f" * {line}" for line in comment), " */", *body]) + "\n"


def header():
    body = []
    for key, (kind, said) in porcelain.KEYS.items():
        body += [f"/* {said} */", f"ANSWER_KEY({key}, {kind})"]
    return c_header(["The runtime's --porcelain keys, one ANSWER_KEY(key, kind) a line:",
                     "written by scripts/answer_keys.py from their one table,",
                     "runtime/berth/porcelain.py's KEYS (do not edit). answer.h makes",
                     "struct answer's fields of it and answer.c its parser. No include",
                     "guard: each user defines ANSWER_KEY and includes it."], body)


def status_header():
    body = ["#ifndef BERTH_SPANK_ANSWER_STATUS_H", "#define BERTH_SPANK_ANSWER_STATUS_H"]
    for name, (status, said) in porcelain.STATUSES.items():
        body += [f"/* {said} */", f"#define BERTH_STATUS_{name.upper()} {status}"]
    return c_header(["The runtime's exit statuses the plugin tells apart beyond 0 and 1",
                     "(any other failure), one BERTH_STATUS_<NAME> a line: written by",
                     "scripts/answer_keys.py from their one table,",
                     "runtime/berth/porcelain.py's STATUSES (do not edit)."], body + ["#endif"])


def main(argv):
    if argv not in ([], ["--check"]):
        print("usage: python scripts/answer_keys.py [--check]", file=sys.stderr)
        return 2
    made = {HEADER: header(), STATUS_HEADER: status_header()}
    if argv == ["--check"]:
        stale = [path for path, text in made.items()
                 if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: python scripts/answer_keys.py")
        return 1 if stale else 0
    for path, text in made.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
