"""The one rule for the names Kiln puts in paths and URLs: adapters, eval suites, datasets, scorers.

Pure Python (the CLI checks names with it before sending, without Django). A name is 1-64 of
letters, digits, `.`, `_` and `-`, starting with a letter or digit, with no `..` (it becomes a
folder or file name). The whole string must match: a trailing newline is not a name.
"""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "use letters, digits, '.', '_' and '-' (at most 64), starting with a letter or digit"


def is_valid_name(name, *, reserved: tuple[str, ...] = ()) -> bool:
    return isinstance(name, str) and NAME_PATTERN.fullmatch(name) is not None and ".." not in name \
        and name not in reserved
