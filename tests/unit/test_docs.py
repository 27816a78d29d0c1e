"""The design pages stay short, and every relative Markdown link in the docs points to a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_design_pages_are_short() -> None:
    pages = sorted((DOCS / "design").glob("*.md"))
    assert pages, "no pages under docs/design/"
    for page in pages:
        assert page.stat().st_size < 10_000, f"{page.relative_to(ROOT)} is {page.stat().st_size} bytes"
    index = DOCS / "design.md"
    assert index.stat().st_size < 3_000, f"docs/design.md is {index.stat().st_size} bytes"


def test_relative_links_point_to_files() -> None:
    broken = []
    for md in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # URLs, mailto:, in-page anchors
            path = target.split("#", 1)[0]
            if not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


#: Internal numbering readers outside the team cannot resolve: issue numbers, the papers' seed
#: numbers (with or without the word, as in "001 Fig. 13"), rows of an issue's table.
INTERNAL = re.compile(
    r"\b[Ii]ssues? [0-9]+\b"
    r"|\b[Ss]eeds? 0[0-9]{2}\b"
    r"|(?<![\w.,])00[0-9](?= (?:§|Figs?\.|Tables?\b|Algorithm))"
    r"|\brows? [0-9]+ of issue\b"
)


def test_docs_name_papers_and_features_not_internal_numbers() -> None:
    """User-facing pages name papers and features, never issue or seed numbers."""
    hits = []
    for md in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            for m in INTERNAL.finditer(line):
                hits.append(f"{md.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:120]}")
    assert not hits, "internal numbering in the docs (name the paper or the feature instead):\n" + "\n".join(hits)
