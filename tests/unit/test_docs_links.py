"""The README stays short and starts with the two commands, and every relative link
in the README, docs/ and the roles' READMEs leads somewhere: the file (or folder)
exists inside the repository, and a `#anchor` names a heading of the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmfleet.paths import REPO_ROOT

PAGES = sorted(
    [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"), *(REPO_ROOT / "roles").glob("*/README.md")]
)
# The README is a front page (issue 33): the two commands, what llmfleet is, the diagram, the headline figures,
# the known-failure table (tests/unit/test_failure_modes_doc.py checks it against docs/failure-modes.md) and links.
# The alert table lives in docs/monitoring.md only; the rest of the detail lives in docs/.
README_MAX_LINES = 160
# Longer lines are paragraphs or table cells that belong in docs/ (or want wrapping).
README_MAX_LINE_CHARS = 200
# [text](target) or [text](target "title"); images too. Not inside code.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without fenced blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(page.read_text())) if not re.match(r"[a-z]+:", target)]


def test_pages_are_found() -> None:
    assert REPO_ROOT / "README.md" in PAGES and len(PAGES) > 3


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO_ROOT)) for page in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO_ROOT)}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: broken links:\n" + "\n".join(broken)


def test_the_check_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\nSee [a](#two-words), [b](#nothing), [c](missing.md).\n"
                    "```\n[not a link](inside-code.md)\n```\n`[nor](this.md)` and [web](https://example.org).\n")
    assert _links(page) == ["#two-words", "#nothing", "missing.md"]
    assert _anchors(page) == {"title", "two-words"}


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, (
        f"README.md has {len(text.splitlines())} lines (at most {README_MAX_LINES}): move the detail to docs/"
    )
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    assert first_block and text.index("```sh") < text.index("\n## ", text.index("## The two commands") + 1)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["scripts/lab.sh", "scripts/test.sh"]
    assert all((REPO_ROOT / command).is_file() for command in commands)


def test_readme_lines_are_short() -> None:
    long_lines = [
        f"line {number}: {len(line)} characters"
        for number, line in enumerate((REPO_ROOT / "README.md").read_text().splitlines(), start=1)
        if len(line) > README_MAX_LINE_CHARS
    ]
    assert not long_lines, f"README.md lines over {README_MAX_LINE_CHARS} characters (wrap them): {long_lines}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {target.partition("#")[0] for target in _links(REPO_ROOT / "README.md")}
    unlinked = sorted(
        page.relative_to(REPO_ROOT).as_posix()
        for page in (REPO_ROOT / "docs").glob("*.md")
        if page.relative_to(REPO_ROOT).as_posix() not in linked
    )
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
