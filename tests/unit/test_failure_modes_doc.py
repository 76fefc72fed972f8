"""docs/failure-modes.md keeps one section per row of DESIGN's failure-mode table, each with its parts,
and every test it names exists.

The doc names tests as pytest node ids (`path.py::test_name`, optionally `::Class::test_name` or
`[param-id]`). This file does not run them: it checks that the file exists, defines that test (read with
`ast`, so Molecule testinfra files under roles/ count too) and is linked from the same section.

DESIGN.md lives beside the repository (../shared/DESIGN.md), not in it: where it is present, its table's
row numbers must all have a section; the doc's own summary table carries the 15 titles either way.

The summary table (number, title linked to its section, where it is caught, coverage) lives in this doc
only; the README links to it and keeps no copy that could drift (issue 33).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmfleet.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "failure-modes.md"
README = REPO_ROOT / "README.md"
DESIGN = REPO_ROOT.parent / "shared" / "DESIGN.md"
ROWS = 15
COVERAGE = ("covered", "partial", "not proven")
# The labelled paragraphs every section has, in this order.
PARTS = (
    "**Coverage:**",
    "**Symptom.**",
    "**Where llmfleet catches it.**",
    "**What the operator gets.**",
    "**Confirm on a host.**",
    "**Fix.**",
    "**Tests that prove it.**",
)
NOT_PROVEN = "**Not yet proven.**"

HEADING = re.compile(r"^## (\d+)\. ([^\n]+?)[ \t]*$", re.MULTILINE)
# number, title linked to its section, where it is caught (not empty), coverage.
SUMMARY_ROW = re.compile(
    r"^\| (\d+) \| \[([^\]]+)\]\(#([^)]+)\) \| [^|\n]*[^|\s][^|\n]* \| ([a-z ]+) \|$", re.MULTILINE
)
NODE_ID = re.compile(r"`([\w./-]+\.py)::(\w+(?:::\w+)?)(?:\[[^\]`]*\])?`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
COVERAGE_LINE = re.compile(r"^\*\*Coverage:\*\* ([^\n]+?)[ \t]*$", re.MULTILINE)
DESIGN_ROW = re.compile(r"^\| (\d+) \|", re.MULTILINE)
# A row of the failure table linked into the doc from elsewhere: the README must have none.
README_ROW = re.compile(r"^\| (\d+) \| \[([^\]]+)\]\(docs/failure-modes\.md#([^)]+)\)", re.MULTILINE)


@dataclass(frozen=True)
class Section:
    number: int
    title: str
    body: str


def sections(text: str) -> list[Section]:
    """The `## N. Title` sections, each with its text up to the next `## ` heading."""
    headings = list(re.finditer(r"^## ", text, flags=re.MULTILINE))
    found = []
    for index, start in enumerate(headings):
        end = headings[index + 1].start() if index + 1 < len(headings) else len(text)
        chunk = text[start.start() : end]
        match = HEADING.match(chunk)
        if match:
            found.append(Section(int(match.group(1)), match.group(2), chunk[match.end() :]))
    return found


def slug(title: str) -> str:
    """GitHub's heading id, as tests/unit/test_docs_links.py computes it."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def defined_tests(path: Path) -> set[str]:
    """`test_x` and `Class::test_x` for every test function or method the file defines."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return {name for name in names if name.rsplit("::", 1)[-1].startswith("test")}


def numbering_problems(found: list[Section]) -> list[str]:
    numbers = [section.number for section in found]
    if numbers == list(range(1, ROWS + 1)):
        return []
    missing = sorted(set(range(1, ROWS + 1)) - set(numbers))
    return [f"sections are numbered {numbers}, not 1..{ROWS} in order; missing: {missing}"]


def part_problems(section: Section) -> list[str]:
    where = f"section {section.number} ({section.title})"
    problems = []
    positions = []
    for part in PARTS:
        index = section.body.find(f"\n{part}")
        if index < 0:
            problems.append(f"{where}: no {part} paragraph")
        positions.append(index)
    present = [position for position in positions if position >= 0]
    if present != sorted(present):
        problems.append(f"{where}: the parts are not in the order {', '.join(PARTS)}")
    coverage = COVERAGE_LINE.search(section.body)
    verdict = coverage.group(1) if coverage else None
    if coverage and verdict not in COVERAGE:
        problems.append(f"{where}: coverage {verdict!r} is not one of {', '.join(COVERAGE)}")
    if verdict != "covered" and f"\n{NOT_PROVEN}" not in section.body:
        problems.append(f"{where}: coverage is {verdict!r} but there is no {NOT_PROVEN} paragraph")
    tests_part = section.body.partition("\n**Tests that prove it.**")[2].partition(f"\n{NOT_PROVEN}")[0]
    if verdict != "not proven" and not NODE_ID.search(tests_part):
        problems.append(f"{where}: {PARTS[-1]} names no test node id")
    return problems


def node_id_problems(section: Section, doc_dir: Path, root: Path) -> list[str]:
    """Every node id names a test that exists, in a file the same section links to."""
    where = f"section {section.number} ({section.title})"
    linked = {(doc_dir / target).resolve() for target in LINK.findall(section.body)}
    problems = []
    for relative, name in NODE_ID.findall(section.body):
        path = (root / relative).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_file():
            problems.append(f"{where}: {relative}::{name}: no file {relative} in the repository")
            continue
        if name not in defined_tests(path):
            problems.append(f"{where}: {relative}::{name}: {relative} defines no test {name}")
        if path not in linked:
            problems.append(f"{where}: {relative}::{name}: the section has no link to {relative}")
    return problems


def summary_problems(text: str, found: list[Section]) -> list[str]:
    """The summary table lists the 15 rows with their titles, anchors and coverage as the sections have them."""
    rows = SUMMARY_ROW.findall(text)
    if [int(number) for number, *_ in rows] != list(range(1, ROWS + 1)):
        return [f"the summary table has rows {[int(number) for number, *_ in rows]}, not 1..{ROWS}"]
    by_number = {section.number: section for section in found}
    problems = []
    for number, title, anchor, coverage in rows:
        section = by_number.get(int(number))
        if section is None:
            continue  # numbering_problems names it
        if title != section.title:
            problems.append(f"summary row {number}: title {title!r} is not the heading's {section.title!r}")
        if anchor != slug(f"{number}. {section.title}"):
            problems.append(f"summary row {number}: #{anchor} is not the heading's anchor")
        verdict = COVERAGE_LINE.search(section.body)
        if verdict is None or verdict.group(1) != coverage:
            problems.append(f"summary row {number}: coverage {coverage!r} differs from the section's")
    return problems


def readme_problems(readme: str) -> list[str]:
    """The README links the doc's table and carries no copy of its rows, which could drift from it."""
    problems = []
    if "](docs/failure-modes.md" not in readme:
        problems.append("the README does not link docs/failure-modes.md")
    copied = [int(number) for number, *_ in README_ROW.findall(readme)]
    if copied:
        problems.append(f"the README repeats rows {copied} of docs/failure-modes.md's table: link to it instead")
    return problems


def all_problems(text: str, doc_dir: Path, root: Path) -> list[str]:
    found = sections(text)
    problems = numbering_problems(found) + summary_problems(text, found)
    for section in found:
        problems += part_problems(section) + node_id_problems(section, doc_dir, root)
    return problems


# --- the real doc ------------------------------------------------------------------------------


def test_the_doc_has_one_section_per_row_in_order() -> None:
    found = sections(DOC.read_text())
    assert not numbering_problems(found), numbering_problems(found)


def test_the_summary_table_lists_every_row_as_its_section_does() -> None:
    text = DOC.read_text()
    problems = summary_problems(text, sections(text))
    assert not problems, "docs/failure-modes.md:\n" + "\n".join(problems)


def test_the_readme_links_the_table_and_keeps_no_copy() -> None:
    problems = readme_problems(README.read_text())
    assert not problems, problems


def test_a_readme_copy_of_the_table_is_named() -> None:
    copied = README.read_text() + "\n" + DOC.read_text().replace("](#", "](docs/failure-modes.md#")
    assert readme_problems(copied) == [
        f"the README repeats rows {list(range(1, ROWS + 1))} of docs/failure-modes.md's table: link to it instead"
    ]
    assert readme_problems("# llmfleet\n") == ["the README does not link docs/failure-modes.md"]


def test_a_summary_row_whose_coverage_lags_its_section_is_named() -> None:
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 3 | ["))
    assert row.endswith("| covered |"), row
    stale = text.replace(row, row.replace("| covered |", "| partial |"))
    assert summary_problems(stale, sections(stale)) == ["summary row 3: coverage 'partial' differs from the section's"]


def test_a_summary_row_that_says_not_where_it_is_caught_is_not_a_row() -> None:
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 3 | ["))
    emptied = text.replace(row, "|".join([*row.split("|")[:3], "  ", *row.split("|")[4:]]))
    assert summary_problems(emptied, sections(emptied)) == [
        f"the summary table has rows {[n for n in range(1, ROWS + 1) if n != 3]}, not 1..{ROWS}"
    ]


@pytest.mark.parametrize("number", range(1, ROWS + 1))
def test_each_section_has_its_parts(number: int) -> None:
    section = next((s for s in sections(DOC.read_text()) if s.number == number), None)
    assert section is not None, f"docs/failure-modes.md has no section {number}"
    problems = part_problems(section)
    assert not problems, "docs/failure-modes.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("number", range(1, ROWS + 1))
def test_every_named_test_exists_and_is_linked(number: int) -> None:
    section = next((s for s in sections(DOC.read_text()) if s.number == number), None)
    assert section is not None, f"docs/failure-modes.md has no section {number}"
    problems = node_id_problems(section, DOC.parent, REPO_ROOT)
    assert not problems, "docs/failure-modes.md:\n" + "\n".join(problems)


def test_every_row_of_designs_table_has_a_section() -> None:
    if not DESIGN.is_file():
        pytest.skip(f"{DESIGN} is outside the repository and absent here; the doc's own summary table is checked")
    design = DESIGN.read_text()
    table = design.partition("## Known failure modes this project must catch")[2].partition("\n## ")[0]
    rows = [int(number) for number in DESIGN_ROW.findall(table)]
    assert rows == list(range(1, ROWS + 1)), f"DESIGN.md's failure-mode table has rows {rows}: update the doc and ROWS"
    documented = {section.number for section in sections(DOC.read_text())}
    assert set(rows) <= documented, f"DESIGN.md rows without a section: {sorted(set(rows) - documented)}"


# --- the checker finds what it is meant to find ----------------------------------------------


def _write_fixture(root: Path) -> Path:
    (root / "tests").mkdir()
    (root / "tests" / "test_a.py").write_text(
        "def test_real():\n    pass\n\nasync def test_async():\n    pass\n\n"
        "def helper():\n    pass\n\nclass TestGroup:\n    def test_method(self):\n        pass\n"
    )
    (root / "docs").mkdir()
    return root / "docs"


def _section(number: int, title: str, coverage: str, tests: str, not_proven: bool = True) -> str:
    parts = [
        f"## {number}. {title}\n",
        f"**Coverage:** {coverage}\n",
        "**Symptom.** s\n",
        "**Where llmfleet catches it.** w\n",
        "**What the operator gets.** m\n",
        "**Confirm on a host.** c\n",
        "**Fix.** f\n",
        f"**Tests that prove it.**\n{tests}\n",
    ]
    if not_proven:
        parts.append("**Not yet proven.** n\n")
    return "\n".join(parts)


def test_defined_tests_reads_functions_async_functions_and_methods(tmp_path: Path) -> None:
    _write_fixture(tmp_path)
    assert defined_tests(tmp_path / "tests" / "test_a.py") == {"test_real", "test_async", "TestGroup::test_method"}


def test_the_checker_names_a_missing_test_file_link_and_part(tmp_path: Path) -> None:
    doc_dir = _write_fixture(tmp_path)
    good = "- `tests/test_a.py::test_real[case-1]` ([file](../tests/test_a.py))"
    text = "\n".join([
        _section(1, "Fine", "covered", good, not_proven=False),
        _section(2, "Missing test", "partial", "- `tests/test_a.py::test_gone` ([file](../tests/test_a.py))"),
        _section(3, "Helper is not a test", "partial", "- `tests/test_a.py::helper` ([file](../tests/test_a.py))"),
        _section(4, "No such file", "partial", "- `tests/test_b.py::test_real` ([file](../tests/test_b.py))"),
        _section(5, "Unlinked", "partial", "- `tests/test_a.py::TestGroup::test_method`"),
        _section(6, "Partial without a gap", "partial", good, not_proven=False),
        _section(7, "Nothing named", "covered", "none", not_proven=False),
    ])  # fmt: skip
    found = sections(text)
    problems = [problem for section in found for problem in part_problems(section)]
    problems += [problem for section in found for problem in node_id_problems(section, doc_dir, tmp_path)]
    assert problems == [
        "section 6 (Partial without a gap): coverage is 'partial' but there is no **Not yet proven.** paragraph",
        "section 7 (Nothing named): **Tests that prove it.** names no test node id",
        "section 2 (Missing test): tests/test_a.py::test_gone: tests/test_a.py defines no test test_gone",
        "section 3 (Helper is not a test): tests/test_a.py::helper: tests/test_a.py defines no test helper",
        "section 4 (No such file): tests/test_b.py::test_real: no file tests/test_b.py in the repository",
        "section 5 (Unlinked): tests/test_a.py::TestGroup::test_method: the section has no link to tests/test_a.py",
    ]


def test_the_checker_names_missing_parts_numbering_and_summary_drift(tmp_path: Path) -> None:
    doc_dir = _write_fixture(tmp_path)
    good = "- `tests/test_a.py::test_real` ([file](../tests/test_a.py))"
    broken = _section(2, "No fix", "maybe", good).replace("**Fix.** f\n", "")
    summary = "| 1 | [One](#1-one) | c | covered |\n| 2 | [Two](#2-two) | c | partial |\n"
    text = summary + _section(1, "One", "covered", good, not_proven=False) + broken
    problems = all_problems(text, doc_dir, tmp_path)
    assert problems[0].startswith("sections are numbered [1, 2], not 1..15 in order; missing: [3, 4,")
    assert problems[1] == "the summary table has rows [1, 2], not 1..15"
    assert "section 2 (No fix): no **Fix.** paragraph" in problems
    assert "section 2 (No fix): coverage 'maybe' is not one of covered, partial, not proven" in problems
    full_summary = "".join(f"| {n} | [T{n}](#{n}-t{n}) | check {n} | covered |\n" for n in range(1, ROWS + 1))
    renamed = full_summary.replace("[T1](#1-t1)", "[Other](#1-other)")
    drift = summary_problems(renamed, [Section(1, "T1", "\n**Coverage:** partial\n")])
    assert drift == [
        "summary row 1: title 'Other' is not the heading's 'T1'",
        "summary row 1: #1-other is not the heading's anchor",
        "summary row 1: coverage 'covered' differs from the section's",
    ]
