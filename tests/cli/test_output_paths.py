"""Every download or collection output is checked before anything is fetched or collected: its folder
exists and is writable, and it is not a folder or a device (one coded line each, with a hint)."""

from __future__ import annotations

import pytest

from kiln_project.cli.client import CliError
from kiln_project.cli.openenv_runs_cmd import retained_note
from kiln_project.cli.output import check_output_path


def test_a_missing_folder_or_a_folder_as_output_is_refused_by_name(tmp_path):
    with pytest.raises(CliError) as missing:
        check_output_path(tmp_path / "nope" / "x.jsonl")
    assert missing.value.code == "output_folder_not_found" and str(tmp_path / "nope") in missing.value.message
    assert missing.value.hint
    with pytest.raises(CliError) as folder:
        check_output_path(tmp_path)
    assert folder.value.code == "output_not_a_file" and folder.value.hint == "name a file path for the output"
    check_output_path(tmp_path / "fine.jsonl")  # a new file in an existing folder


def test_a_retained_runs_note_names_the_run_to_follow():
    note = retained_note({"run_id": "4b1c", "state": "collecting", "idempotency_key": "k"})
    assert "kiln openenv status 4b1c --follow" in note and " RUN " not in note
