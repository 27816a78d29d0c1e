"""The slowest tests of a whole `make test` (its parallel and its serial phase together), from the JUnit
XML files pytest wrote: ``python scripts/test_summary.py DIR [--top 20]``."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="the directory of the phases' JUnit XML files")
    ap.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list (default 20)")
    a = ap.parse_args(argv)
    rows: list[tuple[float, str]] = []
    walls = []
    for xml in sorted(Path(a.dir).glob("*.xml")):
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for suite in suites:
            walls.append((xml.stem, float(suite.get("time", 0.0)), int(suite.get("tests", 0))))
            for case in suite.iter("testcase"):
                name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                rows.append((float(case.get("time", 0.0)), name))
    if not rows:
        print(f"test_summary: no JUnit XML under {a.dir}", file=sys.stderr)
        return 1
    rows.sort(reverse=True)
    print(f"slowest {min(a.top, len(rows))} of {len(rows)} tests (seconds, setup and teardown included):")
    for t, name in rows[:a.top]:
        print(f"  {t:7.1f}  {name}")
    print("phases: " + "; ".join(f"{stem} {n} tests in {t:.0f} s" for stem, t, n in walls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
