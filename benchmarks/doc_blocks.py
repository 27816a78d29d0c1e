"""Replace generated blocks of a Markdown page: the text between ``<!-- NAME -->`` and ``<!-- /NAME -->``.

Used by the table scripts beside this file, so the numbers on a page are those of a committed
result file.
"""

from __future__ import annotations

import re


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
