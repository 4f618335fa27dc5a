"""The documentation site (mkdocs.yml, docs/) builds with `mkdocs build
--strict`, so a broken link or anchor fails, and its navigation leads an
admin through the guide in the order a site installs Berth."""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# The admin guide's pages, in install order: what the site provides first,
# the inventory and its variables and secrets, the deployment and its check,
# then what a site turns on, runs and fixes afterwards.
ADMIN_GUIDE = [
    ("admin/prerequisites/", "Prerequisites"),
    ("admin/inventory/", "Inventory"),
    ("admin/variables/", "Variables"),
    ("admin/vault/", "The vault file"),
    ("admin/deploy/", "Deploy"),
    ("admin/existing-slurm/", "Onto an existing Slurm"),
    ("admin/from-pyxis/", "Moving from pyxis and enroot"),
    ("admin/validate/", "Validate"),
    ("admin/accounting/", "Accounting"),
    ("admin/store/", "The shared image store"),
    ("admin/mirrors/", "Mirrors and the registry cache"),
    ("admin/hooks/", "Hooks"),
    ("admin/day2/", "Day 2 and upgrades"),
    ("admin/day2/logs/", "Where the logs are"),
    ("admin/day2/why-did-job-fail/", "Why did job N fail?"),
    ("admin/day2/nodes/", "Adding or removing a node"),
    ("admin/day2/upgrade/", "Upgrades"),
    ("admin/day2/munge-key/", "Rotating the munge key"),
    ("admin/day2/remove/", "Removing Berth"),
    ("admin/troubleshooting/", "Troubleshooting"),
]


class _NavLinks(HTMLParser):
    """(href, label) of every link of the site's navigation, in page order."""

    def __init__(self):
        super().__init__()
        self.links, self._open = [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and "md-nav__link" in (attrs.get("class") or "").split():
            self._open = [attrs.get("href", ""), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[1] += data

    def handle_endtag(self, tag):
        if tag == "a" and self._open is not None:
            href, label = self._open
            if not href.startswith("#"):  # a page's own table of contents
                self.links.append((href, " ".join(label.split())))
            self._open = None


def _build(site):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    parser = _NavLinks()
    parser.feed((site / "index.html").read_text())
    return parser.links


def test_the_site_builds_strict_and_its_admin_guide_follows_the_install_order(tmp_path):
    links = _build(tmp_path / "site")
    admin = [(href, label) for href, label in links if href.startswith("admin/") and href != "admin/"]
    assert admin == ADMIN_GUIDE
    for href, _ in ADMIN_GUIDE:
        assert (tmp_path / "site" / href / "index.html").is_file(), href
    labels = [label for _, label in links]
    for part in ["Admin guide", "User guide", "Compatibility", "Security model", "Architecture",
                 "Testing", "Benchmarks"]:
        assert part in labels, labels
    # the admin guide comes before the rest, after the home page only
    assert labels.index("Admin guide") == 1, labels


def test_the_readme_is_short_and_opens_with_the_two_commands():
    """README.md is the entry, at most 300 lines: the demo and the test suite
    first, then the quick starts and where each topic lives in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["bash", "scripts/demo.sh"],
                                                           ["bash", "scripts/test.sh"]]
    for page in ["docs/admin/index.md", "docs/user/index.md", "docs/compatibility.md",
                 "docs/security.md", "docs/testing.md", "docs/benchmarks.md"]:
        assert f"]({page})" in readme, page


# A table row is read in one glance; a cell longer than this is text that
# belongs below its table.
LONGEST_CELL = 320


def _table_cells(text):
    """(line number, cell) of every table cell outside code fences."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            continue
        for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]:
            yield number, cell.strip()


def _pages():
    return sorted((ROOT / "docs").rglob("*.md"))


def test_no_table_cell_is_a_paragraph():
    long_cells = [f"{page.relative_to(ROOT)}:{number}: {len(cell)} characters"
                  for page in _pages()
                  for number, cell in _table_cells(page.read_text()) if len(cell) > LONGEST_CELL]
    assert long_cells == []


def test_the_manual_cites_no_issue_of_this_project():
    """Project history (issue numbers, what broke on the way) stays in the
    tracker and CHANGELOG.md; an upstream's issue is named as owner/repo#N."""
    cited = [f"{page.relative_to(ROOT)}: {match.group(0)}" for page in _pages()
             for match in re.finditer(r"\bissues? \d+|\bissue \d+'s", page.read_text(), re.I)]
    assert cited == []


def test_a_table_cell_checker_sees_a_long_cell():
    text = "| a | b |\n| --- | --- |\n| x | " + "y" * (LONGEST_CELL + 1) + " |\n```\n| " + "z" * 400 + " |\n```\n"
    assert [number for number, cell in _table_cells(text) if len(cell) > LONGEST_CELL] == [3]


_RELEASES = {"bookworm": "12", "trixie": "13", "jammy": "22.04", "noble": "24.04", "9": "9"}


# Roles the cluster scenario does not run (it builds a cluster from nothing),
# and where they are tested instead.
TESTED_ELSEWHERE = {"adopt": "tests/test_adopt_role.py runs it in Debian 12 containers, molecule/adopt "
                              "on a Debian 12 cluster with pyxis 0.24.0 and enroot 4.1.2, both ways"}


def _platform_line(meta):
    """The Requirements line a role's README states, from its meta/main.yml."""
    platforms = {p["name"]: [_RELEASES[str(v)] for v in p["versions"]]
                 for p in yaml.safe_load(meta.read_text())["galaxy_info"]["platforms"]}
    assert platforms.pop("Debian") == ["12", "13"], meta
    untested = [f"{name} {' and '.join(versions)}" for name, versions in platforms.items()]
    tested = TESTED_ELSEWHERE.get(meta.parent.parent.name,
                                  "the cluster scenario runs every role on both")
    return (f"Platforms: Debian 12 and 13 (tested: {tested}); "
            f"{' and '.join(untested)} (package names only, untested).")


def test_each_role_readme_states_the_platforms_of_its_meta():
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        readme = meta.parent.parent / "README.md"
        if "## Requirements" in readme.read_text():
            assert _platform_line(meta) in readme.read_text(), readme
