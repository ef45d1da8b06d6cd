"""Reading a rendered dashboard page in tests: its HTML, and an element's text by id with tags stripped."""

from __future__ import annotations

import re
from html import unescape


def html_of(response) -> str:
    return response.content.decode()


def text_of(html: str, element_id: str) -> str:
    """The text of the element with this id, up to its own closing tag."""
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:span|dd|p|div|td|strong|li|code)>', html, re.S)
    assert match, element_id
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", match.group(1))).split())


def block_of(html: str, element_id: str, end: str = "</p>") -> str:
    """The text of an element (tags stripped) up to its first `end`."""
    start = html.index(">", html.index(f'id="{element_id}"')) + 1
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html[start:html.index(end, start)])).split())
