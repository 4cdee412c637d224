"""specviz.models.gguf_tensors reads a GGUF's tensors as gguf's GGUFReader does (names, types, dimensions, the same
bytes in the same numpy shapes), without building the metadata, and refuses a file that is not a GGUF or is cut
short with a clear error."""
import gguf
import numpy as np
import pytest

from specviz.errors import SpecvizError
from specviz.models import gguf_tensors, quantized


def assert_read_alike(path):
    ours, theirs = gguf_tensors.tensors(path), gguf.GGUFReader(path).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for a, b in zip(ours, theirs):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
    return ours


def written(path, alignment=None):
    """A GGUF with metadata of every kind (string arrays, nested arrays, numbers) ahead of float, integer and
    block tensors of several formats."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("test.nested", [[1, 2], [3, 4, 5]])
    writer.add_string("general.name", "written")
    writer.add_uint64("test.u64", 7)
    writer.add_bool("test.flag", True)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((4, 8)).astype(np.float16))
    writer.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    for name, kind, columns in (("q8", gguf.GGMLQuantizationType.Q8_0, 64), ("q6k", gguf.GGMLQuantizationType.Q6_K, 256),
                                ("q4k", gguf.GGMLQuantizationType.Q4_K, 512)):
        block, size = gguf.GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 256, (3, columns // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_a_written_file_reads_as_gguf_reads_it(tmp_path, alignment):
    tensors = assert_read_alike(written(tmp_path / "w.gguf", alignment))
    assert [t.data.dtype for t in tensors[:3]] == [np.float32, np.float16, np.int32]
    assert tensors[0].shape == (5, 3) and tensors[0].data.shape == (3, 5)  # GGUF's order, and numpy's


def test_the_real_file_reads_as_gguf_reads_it():
    from specviz.models.presets import SMOLLM2_135M

    path = quantized.gguf_path(SMOLLM2_135M)
    if not path.is_file():
        pytest.skip(f"no GGUF in {path.parent} (the first `load(..., weights='q4')` fetches it)")
    tensors = assert_read_alike(path)
    assert len(tensors) == 272 and {t.tensor_type.name for t in tensors} >= {"Q4_1", "Q8_0", "F32"}


def test_not_a_gguf_or_cut_short_is_a_clear_error(tmp_path):
    path = written(tmp_path / "w.gguf")
    whole = path.read_bytes()
    (tmp_path / "other.bin").write_bytes(b"PK\x03\x04" + whole[4:])
    with pytest.raises(SpecvizError, match="not a GGUF file"):
        gguf_tensors.tensors(tmp_path / "other.bin")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(SpecvizError, match="not a GGUF file"):
        gguf_tensors.tensors(tmp_path / "empty.gguf")
    (tmp_path / "head.gguf").write_bytes(whole[:200])  # inside the metadata
    with pytest.raises(SpecvizError, match="cut short"):
        gguf_tensors.tensors(tmp_path / "head.gguf")
    (tmp_path / "body.gguf").write_bytes(whole[:-10])  # the last tensor's bytes
    with pytest.raises(SpecvizError, match="tensor q4k ends past the end"):
        gguf_tensors.tensors(tmp_path / "body.gguf")
