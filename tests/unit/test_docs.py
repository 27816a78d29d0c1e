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
