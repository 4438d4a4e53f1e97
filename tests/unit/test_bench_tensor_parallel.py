"""etptr.bench._tensor_parallel: each rank's share of a model-shaped checkpoint."""
import numpy as np
import pytest

import etptr
from etptr.bench import _tensor_parallel as tp
from etptr.bench._model_shapes import LAYOUTS, write_layout
from etptr.bench._timing import run_cases


def test_the_split_follows_the_layer_kinds():
    assert tp.split_of("model.layers.0.self_attn.q_proj.weight", 2) == 0
    assert tp.split_of("model.layers.0.self_attn.o_proj.weight", 2) == 1
    assert tp.split_of("model.layers.0.mlp.down_proj.weight", 2) == 1
    assert tp.split_of("model.embed_tokens.weight", 2) == 0
    assert tp.split_of("model.layers.0.self_attn.q_proj.bias", 1) == 0
    assert tp.split_of("model.norm.weight", 1) is None


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_ranks_shares_tile_every_split_tensor(world):
    shapes = {"a.q_proj.weight": (10, 4), "a.o_proj.weight": (4, 10), "n.weight": (4,)}
    full = {k: np.arange(np.prod(s)).reshape(s) for k, s in shapes.items()}
    parts = [dict(tp.rank_requests(shapes, r, world)) for r in range(world)]
    q = np.concatenate([full["a.q_proj.weight"][p["a.q_proj.weight"]] for p in parts], axis=0)
    o = np.concatenate([full["a.o_proj.weight"][p["a.o_proj.weight"]] for p in parts], axis=1)
    assert np.array_equal(q, full["a.q_proj.weight"]) and np.array_equal(o, full["a.o_proj.weight"])
    assert all(p["n.weight"] is Ellipsis for p in parts)


def test_the_cases_read_each_ranks_share(tmp_path):
    spec = LAYOUTS["qwen2.5-0.5b"]
    small = type(spec)(spec.name, spec.description,
                       tuple((n, tuple(max(1, d // 16) for d in s)) for n, s in spec.shapes),
                       spec.scalar_type)
    path = write_layout(small, tmp_path)
    cases = tp.tp_cases([str(path)], "cpu", worlds=(2,))
    timings = run_cases(cases, repeats=1, warmup=0, progress=False)
    etptr_case = timings["tp2.etptr"]
    plan = etptr.checkpoint.read_plan(path)
    assert 0 < etptr_case.nbytes <= plan.nbytes * 1.01      # the shares, not more
    if "tp2.safetensors" in timings:
        assert timings["tp2.safetensors"].nbytes == etptr_case.nbytes
