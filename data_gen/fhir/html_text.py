"""HTML attachments as plain text, deterministically (stdlib parser, no network, no scripts).

Block elements (p, div, li, h1-h6, tr, table, section, ...) end a paragraph (a blank line, which
the miner's passage splitter cuts at), `br` a line; `script`/`style`/`head` content is dropped;
entities are decoded; runs of spaces collapse. The same HTML always gives the same text.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCK = {
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "table",
    "tr",
    "ul",
    "ol",
    "li",
    "dl",
    "dt",
    "dd",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "hr",
    "title",
    "body",
}
_DROP = {"script", "style", "head", "template", "noscript"}
_CELL = {"td", "th"}


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.dropping = 0

    def handle_starttag(self, tag, attrs):
        if tag in _DROP:
            self.dropping += 1
        elif tag == "br":
            self.parts.append("\n")
        elif tag in _BLOCK:
            self.parts.append("\n\n")
        elif tag in _CELL:
            self.parts.append(" | ")

    def handle_endtag(self, tag):
        if tag in _DROP:
            self.dropping = max(0, self.dropping - 1)
        elif tag in _BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.dropping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    raw = "".join(parser.parts)
    lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip(" |").strip() for line in raw.split("\n")]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
