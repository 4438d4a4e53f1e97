"""etptr.bench._model_shapes: model-shaped checkpoints with random contents."""
import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import ScalarType
from etptr.bench._model_shapes import (
    LAYOUTS, ModelLayout, bert_layout, qwen2_layout, write_layout)
from etptr.checkpoint import CheckpointError

from _checkpoint_helpers import reference_read


def _expected_qwen2(hidden, layers, intermediate, heads, kv_heads, head_dim, vocab):
    """(tensor count, bytes) of a tied Qwen2 checkpoint in bf16, from its configuration."""
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = (q * hidden + q + 2 * (kv * hidden + kv) + hidden * q
                 + 3 * intermediate * hidden + 2 * hidden)
    params = vocab * hidden + layers * per_layer + hidden
    return 12 * layers + 2, 2 * params


def test_qwen_0_5b_layout():
    layout = LAYOUTS["qwen2.5-0.5b"]
    count, nbytes = _expected_qwen2(896, 24, 4864, 14, 2, 64, 151936)
    assert (layout.tensors, layout.nbytes) == (count, nbytes) == (290, 988_065_536)
    shapes = dict(layout.shapes)
    assert len(shapes) == 290
    assert shapes["model.embed_tokens.weight"] == (151936, 896)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (896, 896)
    assert shapes["model.layers.23.self_attn.k_proj.weight"] == (128, 896)
    assert shapes["model.layers.5.self_attn.v_proj.bias"] == (128,)
    assert shapes["model.layers.5.mlp.down_proj.weight"] == (896, 4864)
    assert shapes["model.norm.weight"] == (896,)
    assert "lm_head.weight" not in shapes and "model.layers.24.mlp.up_proj.weight" not in shapes
    assert "290 bf16 tensors" in layout.description and "988,065,536 bytes" in layout.description


def test_qwen_1_5b_layout():
    layout = LAYOUTS["qwen2.5-1.5b"]
    count, nbytes = _expected_qwen2(1536, 28, 8960, 12, 2, 128, 151936)
    assert (layout.tensors, layout.nbytes) == (count, nbytes) == (338, 3_087_428_608)
    assert dict(layout.shapes)["model.layers.27.self_attn.k_proj.bias"] == (256,)


def test_untied_layout_has_lm_head():
    tied = qwen2_layout("t", hidden=8, layers=1, intermediate=8, heads=2, kv_heads=1,
                        head_dim=4, vocab=10)
    untied = qwen2_layout("u", hidden=8, layers=1, intermediate=8, heads=2, kv_heads=1,
                          head_dim=4, vocab=10, tied=False)
    assert untied.tensors == tied.tensors + 1
    assert dict(untied.shapes)["lm_head.weight"] == (10, 8)


def test_write_a_tiny_layout(tmp_path):
    tiny = qwen2_layout("tiny", hidden=16, layers=2, intermediate=24, heads=2, kv_heads=1,
                        head_dim=8, vocab=32)
    assert isinstance(tiny, ModelLayout) and tiny.tensors == 26
    path = write_layout(tiny, tmp_path / "made", seed=3)
    assert path == tmp_path / "made" / "tiny.safetensors"
    read = reference_read(path)
    assert {n: (d, s) for n, (d, s, _) in read.items()} == {n: ("BF16", s) for n, s in tiny.shapes}
    assert sum(len(raw) for _, _, raw in read.values()) == tiny.nbytes
    values = np.frombuffer(b"".join(raw for _, _, raw in read.values()), ml_dtypes.bfloat16)
    as_float = values.astype(np.float32)
    assert np.isfinite(as_float).all() and (np.abs(as_float) < 2).all()
    assert len(np.unique(values.view(np.uint16))) > tiny.nbytes // 8     # not a constant fill
    loaded = etptr.load_safetensors(path, "cpu")
    assert all(t.scalar_type == ScalarType.BFloat16 for t in loaded.values())


def test_minilm_layout_matches_the_published_checkpoint():
    # all-MiniLM-L6-v2's model.safetensors: 104 tensors, 90,856,960 bytes, with its
    # position_ids as int64 (here fp32: 2,048 bytes fewer)
    layout = LAYOUTS["all-minilm-l6-v2"]
    assert layout.tensors == 104 and layout.scalar_type == ScalarType.Float
    assert layout.nbytes == 90_856_960 - 512 * 4
    shapes = dict(layout.shapes)
    assert shapes["embeddings.word_embeddings.weight"] == (30522, 384)
    assert shapes["encoder.layer.5.intermediate.dense.weight"] == (1536, 384)
    assert shapes["encoder.layer.5.output.dense.weight"] == (384, 1536)
    assert shapes["pooler.dense.bias"] == (384,)


def test_write_a_tiny_fp32_layout(tmp_path):
    tiny = bert_layout("b", hidden=8, layers=2, intermediate=16, vocab=20, positions=6,
                       type_vocab=2)
    assert tiny.tensors == 6 + 2 * 16 + 2
    read = reference_read(write_layout(tiny, tmp_path, seed=4))
    assert {n: (d, s) for n, (d, s, _) in read.items()} == {n: ("F32", s) for n, s in tiny.shapes}
    values = np.frombuffer(b"".join(raw for _, _, raw in read.values()), np.float32)
    assert values.size * 4 == tiny.nbytes
    assert np.isfinite(values).all() and (np.abs(values) < 2).all()
    assert len(np.unique(values)) > values.size // 2


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bert_layout_refuses_bad_sizes(bad):
    with pytest.raises(CheckpointError, match="hidden="):
        bert_layout("b", hidden=bad, layers=1, intermediate=4, vocab=4, positions=4,
                    type_vocab=1)


def test_same_seed_same_bytes(tmp_path):
    tiny = qwen2_layout("tiny", hidden=8, layers=1, intermediate=8, heads=1, kv_heads=1,
                        head_dim=8, vocab=16)
    a = write_layout(tiny, tmp_path / "a", seed=1).read_bytes()
    b = write_layout(tiny, tmp_path / "b", seed=1).read_bytes()
    c = write_layout(tiny, tmp_path / "c", seed=2).read_bytes()
    assert a == b and a != c


@pytest.mark.parametrize("name", ["qwen2.5-7b", 3, None])
def test_unknown_layout(tmp_path, name):
    with pytest.raises(CheckpointError, match="known: all-minilm-l6-v2, qwen2.5-0.5b, qwen2.5-1.5b"):
        write_layout(name, tmp_path)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed(tmp_path, seed):
    with pytest.raises(CheckpointError, match="seed="):
        write_layout(LAYOUTS["qwen2.5-0.5b"], tmp_path, seed=seed)


@pytest.mark.parametrize("arg", ["hidden", "layers", "vocab"])
def test_bad_configuration(arg):
    sizes = dict(hidden=8, layers=1, intermediate=8, heads=1, kv_heads=1, head_dim=8, vocab=16)
    sizes[arg] = 0
    with pytest.raises(CheckpointError, match=f"{arg}=0"):
        qwen2_layout("x", **sizes)
