"""Dataset uploads refuse JSON nested too deeply, integers over 4300 digits, NaN and bytes that are not
UTF-8 with the messages they always gave, now through the kernel's shared loader
(core.contracts.groups.load_json), which the GRPO corpus, the tasks loader and the CLI use too."""

import pytest

from evaluations.datasets.formats import FormatError, parse_rows


@pytest.mark.parametrize(("data", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, "file line 2: is nested too deeply"),
    (b'{"a": 1' + b"0" * 5000 + b"}", "file line 2: is not valid JSON (Exceeds the limit (4300 digits)"),
    (b'{"a": NaN}', "file line 2: is not valid JSON (NaN is not JSON)"),
    (b'{"a": "\xff"}', "file line 2: is not valid JSON (not UTF-8 text)"),
])
def test_hostile_lines_keep_their_messages(data, message):
    with pytest.raises(FormatError) as err:
        parse_rows(b'{"ok": 1}\n' + data + b"\n", "raw")
    assert err.value.line == 2 and err.value.message.startswith(message)


def test_a_leading_bom_is_accepted():
    assert parse_rows(b'\xef\xbb\xbf{"a": 1}\n', "raw") == ([{"a": 1}], [1])
