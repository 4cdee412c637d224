"""Files written whole or not at all (specviz.atomic): reports, traces, checkpoints, shards."""
import os

import pytest

from specviz.atomic import check_writable, replacing, write_atomically
from specviz.errors import SpecvizError


def test_a_write_replaces_the_old_file_whole(tmp_path):
    path = tmp_path / "deep" / "report.json"  # missing folders are made
    write_atomically(path, "old")
    write_atomically(path, "new")
    assert path.read_text() == "new" and os.listdir(path.parent) == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_text("old")
    with pytest.raises(OSError, match="disk full"):
        with replacing(path) as temp:
            temp.write_text("half")
            raise OSError("disk full")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_unwritable_targets_are_refused_up_front(tmp_path):
    check_writable(tmp_path / "new" / "folder" / "out.json")  # would be made
    with pytest.raises(SpecvizError, match="it is a folder"):
        check_writable(tmp_path)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SpecvizError, match="not a writable folder"):
        check_writable(tmp_path / "a-file" / "out.json")
