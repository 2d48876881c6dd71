"""MkDocs hook: show `<placeholder>` words (`<cloud>`, `<stack>`) as text.

Markdown passes `<word>` through as an HTML tag, which the browser then hides; the pages use no
raw HTML, so outside code spans and fenced blocks every `<word>` is a placeholder to escape. The
generated configuration table needs this most: its cells come from infra/config/ verbatim."""

from __future__ import annotations

import re
from typing import Any

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
PLACEHOLDER = re.compile(r"<([a-z][\w-]*)>")


def _escape(text: str) -> str:
    out, last = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [PLACEHOLDER.sub(r"&lt;\1&gt;", text[last : span.start()]), span.group(0)]
        last = span.end()
    return "".join(out) + PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:])


def on_page_markdown(markdown: str, **_: Any) -> str:
    out, last = [], 0
    for block in FENCE.finditer(markdown):
        out += [_escape(markdown[last : block.start()]), block.group(0)]
        last = block.end()
    return "".join(out) + _escape(markdown[last:])
