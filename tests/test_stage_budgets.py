"""scripts/test.sh holds each stage's budget in seconds; docs/testing.md's
table shows them. A budget changed in one place and not the other fails here, as
does a closing table that stops marking a stage over its budget by half."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test.sh"


def _script_budgets():
    """{stage: budget} from the STAGES array, as bash reads it."""
    array = re.search(r"^STAGES=\(\n.*?^\)\n", SCRIPT.read_text(), re.M | re.S).group(0)
    entries = subprocess.run(["bash", "-c", array + 'printf "%s\\n" "${STAGES[@]}"'],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    return {key: int(budget) for key, budget, _ in (entry.split("|", 2) for entry in entries)}


def _docs_budgets():
    section = (ROOT / "docs" / "testing.md").read_text().split("## Stage budgets", 1)[1].split("\n#", 1)[0]
    return {key: int(budget) for key, budget in
            re.findall(r"^\| `([a-z0-9-]+)` \| (\d+) \|", section, re.M)}


def test_the_testing_page_shows_every_stage_with_its_budget():
    assert _docs_budgets() == _script_budgets()


def test_the_closing_table_marks_a_stage_over_its_budget_by_half(tmp_path):
    """test.sh's own functions, on made-up stages: one at its budget, one over
    by half and more, one that fails (the table still comes, and the exit)."""
    budgets = _script_budgets()
    text = SCRIPT.read_text()
    functions = text[:text.index("\nstage bootstrap ")]
    functions = functions.replace('cd "$(dirname "$0")/.."', f'cd "{tmp_path}"')
    half_over = budgets["cluster-bookworm"] * 3 // 2  # not more than half over: no mark
    script = functions + f"""
started=$((SECONDS - 2000))
ran=("lint|{budgets['lint']}|" "pytest|{budgets['pytest'] * 2}|1014" "cluster-bookworm|{half_over}|96")
summary
stage lint sh -c 'echo "== 3 passed, 1 warning in 0.1s =="; exit 7'
"""
    result = subprocess.run(["bash", "-c", script, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 7, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()
            if re.match(r"^[a-z-]+ +\d+ ", line)}
    assert "OVER" not in rows["lint"] and "OVER" not in rows["cluster-bookworm"]
    assert re.search(r"^pytest +\d+ +\d+ +1014 +OVER BUDGET by 100 %", rows["pytest"]), rows
    assert rows["cluster-bookworm"].split()[3] == "96"  # the verify tests that passed
    assert re.search(r"^total +\d+ +5400 ", rows["total"]), rows
    assert "test.sh: stage lint failed (exit 7)" in result.stderr
    assert (tmp_path / ".cache/test-logs/lint.log").read_text().startswith("== 3 passed")


def test_stages_beside_run_in_turn_and_stop_at_the_first_failure(tmp_path):
    """A chain of background stages: each one's log, seconds and passed tests
    noted when it is collected; a failed one fails the run at its collect,
    and the stage after it never runs."""
    text = SCRIPT.read_text()
    functions = text[:text.index("\nstage bootstrap ")]
    functions = functions.replace('cd "$(dirname "$0")/.."', f'cd "{tmp_path}"')
    script = functions + """
passes() { echo "== 5 passed in 0.1s =="; }
fails() { echo "== 7 passed, 1 failed in 0.1s =="; exit 3; echo "not reached"; }
beside pytest passes then runtime-trixie fails then cluster-trixie passes
stage lint sh -c 'echo "the foreground stage"'
collect pytest
collect runtime-trixie
echo "not reached either"
"""
    result = subprocess.run(["bash", "-c", script, str(SCRIPT)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 3, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"^[a-z-]+ +\d+ ", line)]
    assert [(row[0], row[3]) for row in rows[:3]] == [("lint", "-"), ("pytest", "5"),
                                                        ("runtime-trixie", "7")], rows
    assert "test.sh: stage runtime-trixie failed (exit 3)" in result.stderr
    logs = tmp_path / ".cache/test-logs"
    assert "not reached" not in (logs / "runtime-trixie.log").read_text()
    assert not (logs / "cluster-trixie.status").exists()  # the chain stopped before it
    assert "not reached either" not in result.stdout
