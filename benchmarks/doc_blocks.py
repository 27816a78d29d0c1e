"""Replace generated blocks of a Markdown page: the text between ``<!-- NAME -->`` and ``<!-- /NAME -->``.

Used by the table scripts beside this file, so the numbers on a page are those of a committed
result file.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any


def write_blocks(page: str, blocks: dict[str, str]) -> None:
    with open(page) as f:
        body = f.read()
    for name, text in blocks.items():
        begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        pat = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pat.search(body):
            raise SystemExit(f"{page} has no {begin} ... {end} block to replace")
        body = pat.sub(lambda _, b=begin, e=end, t=text: f"{b}\n{t}\n{e}", body)
    with open(page, "w") as f:
        f.write(body)


def table_main(doc: str, block: str, render: Callable[[dict[str, Any]], str]) -> None:
    """The command line of a one-block table script: ``RESULT [--write PAGE]`` (print, or replace the
    block ``<!-- block -->`` of PAGE with ``render(result)``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--write", metavar="PAGE", help="replace the generated block of this page")
    ap.add_argument("--block", default=block, help=f"the block's name (default {block})")
    a = ap.parse_args()
    with open(a.result) as f:
        text = render(json.load(f))
    if a.write:
        write_blocks(a.write, {a.block: text})
    else:
        print(text)
