"""Files written whole or not at all."""

import os

import pytest

from docclass import files


def test_a_write_cut_short_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    files.write_atomically(target, '{"old": 1}')
    assert target.read_text() == '{"old": 1}' and os.listdir(tmp_path) == ["metrics.json"]

    def killed(source, destination):  # the process dies between the write and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomically(target, '{"new": 2, "more": "' + "x" * 100_000 + '"}')
    assert target.read_text() == '{"old": 1}'
    monkeypatch.undo()
    files.write_atomically(target, b"\xc3\xa9")  # bytes as they are
    assert target.read_text(encoding="utf-8") == "é"
