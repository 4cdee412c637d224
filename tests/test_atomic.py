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


def test_a_failed_tensor_save_keeps_the_shipped_file(tmp_path, monkeypatch):
    import safetensors.torch
    import torch

    from specviz.atomic import save_tensors_atomically

    path = tmp_path / "model.safetensors"
    save_tensors_atomically({"w": torch.ones(2)}, path)
    def half_written(tensors, name):
        open(name, "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_tensors_atomically({"w": torch.zeros(2)}, path)
    assert safetensors.torch.load_file(path)["w"].tolist() == [1.0, 1.0] and os.listdir(tmp_path) == ["model.safetensors"]


def test_a_tensor_file_gets_the_permissions_of_any_other_written_file(tmp_path):
    """safetensors creates its files 0600; ours follow the umask like every other file we write."""
    import torch

    from specviz.atomic import save_tensors_atomically, write_atomically

    save_tensors_atomically({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    write_atomically(tmp_path / "config.json", "{}")
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes
