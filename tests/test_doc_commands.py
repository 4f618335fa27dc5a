"""The commands an admin copies from README.md and docs/admin run as
written: every shell block's `ansible-playbook` names a playbook that is
there, each `-e NAME=` a variable something reads, and an inventory made
by the quick start (whose vault is encrypted) with a vault password; each
`bash scripts/X` or `python scripts/X` a script that is there. A page
that drifts from the code fails here, naming the page, its line and the
command. (The demo's commands run for real: the README's first two are
what CI runs.)"""

import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "admin").rglob("*.md"))]
FENCE = re.compile(r"^[ \t]*```(?:sh|bash|console|shell)\n(.*?)^[ \t]*```", re.M | re.S)  # (in lists too)
# where the quick start's inventory lives, its group_vars/all/vault.yml encrypted
SITE_INVENTORY = "inventories/mysite"
VAULT_FLAGS = ("--ask-vault-pass", "--vault-password-file", "--vault-id")
# what reads a variable given with -e: the roles' specs and the playbooks
READERS = [*ROOT.glob("roles/*/meta/argument_specs.yml"), *ROOT.glob("roles/*/defaults/*.yml"),
           *ROOT.glob("playbooks/**/*.yml"), ROOT / "site.yml"]


def _commands():
    """(page, line number, words) of each command of each shell block."""
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            joined = re.sub(r"\\\n", " ", block.group(1))
            for offset, line in enumerate(joined.splitlines()):
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith("#"):
                    try:
                        words = shlex.split(line)
                    except ValueError:
                        continue  # (not a shell line: an example's output)
                    yield page.relative_to(ROOT), first + offset, words


def _ansible(words):
    return [w for w in words if w.endswith("ansible-playbook")] and words


def _playbook_problems(words):
    problems = []
    start = next(i for i, w in enumerate(words) if w.endswith("ansible-playbook"))
    args = words[start + 1:]
    books = [w for w in args if w.endswith(".yml") and not w.startswith("-")
             and "inventories/" not in w]
    problems += [f"no playbook {book}" for book in books if not (ROOT / book).is_file()]
    readers = "\n".join(path.read_text() for path in READERS)
    given = [args[i + 1].split("=", 1)[0] for i, w in enumerate(args[:-1]) if w in ("-e", "--extra-vars")]
    problems += [f"nothing reads -e {name}" for name in given
                 if not name.startswith("@") and not re.search(rf"\b{re.escape(name)}\b", readers)]
    if any(SITE_INVENTORY in w for w in args) and not any(w.startswith(VAULT_FLAGS) for w in args) \
            and "--syntax-check" not in args:
        problems.append(f"{SITE_INVENTORY}'s vault is encrypted: no {VAULT_FLAGS[0]}")
    return problems


COMMANDS = list(_commands())


def test_the_pages_have_commands():
    assert sum(1 for _, _, words in COMMANDS if _ansible(words)) >= 10


@pytest.mark.parametrize("page, line, words",
                         [c for c in COMMANDS if _ansible(c[2])],
                         ids=lambda value: str(value) if isinstance(value, (Path, int)) else None)
def test_each_playbook_command_runs_as_written(page, line, words):
    problems = _playbook_problems(words)
    assert not problems, f"{page}:{line}: {' '.join(words)}: {'; '.join(problems)}"


@pytest.mark.parametrize("page, line, words",
                         [c for c in COMMANDS if len(c[2]) > 1 and c[2][0] in ("bash", "python",
                                                                               "python3")
                          and c[2][1].startswith("scripts/")],
                         ids=lambda value: str(value) if isinstance(value, (Path, int)) else None)
def test_each_script_a_page_runs_is_there(page, line, words):
    assert (ROOT / words[1]).is_file(), f"{page}:{line}: no {words[1]}"


def test_a_drifted_command_is_found_out():
    """The check itself: a playbook, a variable and a vault that are not there."""
    words = shlex.split(f"ansible-playbook -i {SITE_INVENTORY}/hosts.yml playbooks/gone.yml "
                        "-e berth_no_such_variable=1")
    assert len(_playbook_problems(words)) == 3
