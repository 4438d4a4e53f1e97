"""The device-buffer layout of a checkpoint file: alignment, order, no overlap, exact runs."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from etptr import ScalarType
from etptr.checkpoint import (
    DEVICE_ALIGNMENT, CheckpointError, CopyRun, FilePlan, TensorEntry, layout_file, parse_header)

from _checkpoint_helpers import entry, write_raw

_TYPES = {1: ScalarType.Byte, 2: ScalarType.BFloat16, 4: ScalarType.Float, 8: ScalarType.Long}


def _plan(specs, keep=None, data_offset=64):
    """A FilePlan of back-to-back tensors; specs are (element size, numel); keep selects."""
    tensors, off = [], 0
    for i, (esize, numel) in enumerate(specs):
        n = esize * numel
        if keep is None or keep[i]:
            tensors.append(TensorEntry(f"t{i}", _TYPES[esize], (numel,), off, off + n))
        off += n
    return FilePlan(Path("f.safetensors"), data_offset + off, data_offset, off, tuple(tensors))


def _check(plan, lay):
    """Every property the layout promises; returns the buffer a copy of the runs fills."""
    a = lay.alignment
    assert lay.names == tuple(t.name for t in plan.tensors)
    assert len(lay.offsets) == len(plan.tensors)
    assert all(o % a == 0 for o in lay.offsets)
    assert list(lay.offsets) == sorted(lay.offsets)            # file order kept
    assert all(o <= lay.nbytes for o in lay.offsets)
    spans = sorted((o, o + t.nbytes) for o, t in zip(lay.offsets, plan.tensors) if t.nbytes)
    for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
        assert e0 <= b1                                          # no overlap
    assert all(e <= lay.nbytes for _, e in spans)
    # the runs: positive, ordered, disjoint on both sides, exactly the tensors' bytes
    assert all(r.nbytes > 0 for r in lay.runs)
    for r0, r1 in zip(lay.runs, lay.runs[1:]):
        assert r0.file_offset + r0.nbytes <= r1.file_offset
        assert r0.buffer_offset + r0.nbytes <= r1.buffer_offset
    assert sum(r.nbytes for r in lay.runs) == sum(t.nbytes for t in plan.tensors)
    assert all(isinstance(x, int) for r in lay.runs
               for x in (r.file_offset, r.buffer_offset, r.nbytes))
    assert lay.nbytes <= plan.nbytes + (a - 1) * len(lay.runs)
    # copying the runs puts every tensor's file bytes at its offset
    rng = np.random.default_rng(len(plan.tensors))
    file = rng.integers(0, 256, plan.file_size, dtype=np.uint8)
    buf = np.zeros(lay.nbytes, np.uint8)
    for r in lay.runs:
        buf[r.buffer_offset:r.buffer_offset + r.nbytes] = file[r.file_offset:r.file_offset + r.nbytes]
    for o, t in zip(lay.offsets, plan.tensors):
        start = plan.data_offset + t.begin
        assert (buf[o:o + t.nbytes] == file[start:start + t.nbytes]).all(), t.name
    return buf


def test_aligned_tensors_are_one_run():
    plan = _plan([(2, 128), (4, 64), (1, 512), (8, 32)])
    lay = layout_file(plan)
    _check(plan, lay)
    assert lay.offsets == (0, 256, 512, 1024) and lay.nbytes == 1280
    assert lay.runs == (CopyRun(64, 0, 1280),)


def test_unaligned_tensor_starts_a_new_run():
    plan = _plan([(1, 256), (1, 100), (1, 156)])
    lay = layout_file(plan)
    _check(plan, lay)
    # the second follows the first (256 is aligned); the third would land at 356
    assert lay.offsets == (0, 256, 512)
    assert lay.runs == (CopyRun(64, 0, 356), CopyRun(64 + 356, 512, 156))
    assert lay.nbytes == 668


def test_subset_breaks_runs_at_gaps():
    plan = _plan([(1, 256), (1, 256), (1, 256)], keep=[True, False, True])
    lay = layout_file(plan)
    _check(plan, lay)
    assert lay.offsets == (0, 256)
    assert lay.runs == (CopyRun(64, 0, 256), CopyRun(64 + 512, 256, 256))


def test_zero_size_tensors_do_not_break_runs():
    plan = _plan([(4, 64), (4, 0), (2, 128), (8, 0)])
    lay = layout_file(plan)
    _check(plan, lay)
    assert len(lay.runs) == 1 and lay.offsets == (0, 256, 256, 512) and lay.nbytes == 512


def test_zero_size_tensor_after_unaligned_bytes_stays_inside_the_buffer():
    plan = _plan([(1, 300), (1, 0)])
    lay = layout_file(plan)
    _check(plan, lay)
    assert lay.offsets == (0, 256) and lay.nbytes == 300


def test_empty_plan():
    lay = layout_file(_plan([]))
    assert lay.offsets == () and lay.runs == () and lay.nbytes == 0
    lay = layout_file(_plan([(4, 0), (1, 0)]))
    assert lay.offsets == (0, 0) and lay.runs == () and lay.nbytes == 0


def test_qwen_like_file_is_one_run():
    # hidden 896 bf16: norms and biases of 1792 bytes are multiples of 256
    specs = [(2, 896), (2, 896 * 896), (2, 896), (2, 128 * 896), (2, 128), (2, 4864 * 896)]
    plan = _plan(specs)
    lay = layout_file(plan)
    _check(plan, lay)
    assert len(lay.runs) == 1 and lay.nbytes == plan.nbytes


def test_other_alignments():
    plan = _plan([(1, 3), (2, 5), (4, 7)])
    for a in (1, 2, 8, 4096):
        lay = layout_file(plan, a)
        assert lay.alignment == a
        _check(plan, lay)
    assert len(layout_file(plan, 1).runs) == 1


@pytest.mark.parametrize("alignment", [0, 3, -256, 100, True, 2.0, "256"])
def test_bad_alignment(alignment):
    with pytest.raises(CheckpointError, match="alignment"):
        layout_file(_plan([(1, 4)]), alignment)


def test_default_alignment_is_256():
    assert DEVICE_ALIGNMENT == 256 and layout_file(_plan([(1, 1)])).alignment == 256


def test_layout_of_a_parsed_file(tmp_path):
    header = {"a": entry("F32", [3], 0, 12), "b": entry("U8", [256], 12, 268),
              "c": entry("F64", [], 268, 276)}
    plan = parse_header(write_raw(tmp_path / "l.safetensors", header, bytes(range(256)) + bytes(20)))
    lay = layout_file(plan)
    _check(plan, lay)
    assert lay.names == ("a", "b", "c") and lay.offsets == (0, 256, 512)
    assert lay.runs[0].file_offset == plan.data_offset


specs_st = st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 700)), max_size=24)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(specs=specs_st, data=st.data(), alignment=st.sampled_from([1, 8, 64, 256, 512]))
def test_layout_properties(specs, data, alignment):
    keep = data.draw(st.lists(st.booleans(), min_size=len(specs), max_size=len(specs)))
    for chosen in (None, keep):
        plan = _plan(specs, chosen, data_offset=8 * data.draw(st.integers(1, 40)))
        _check(plan, layout_file(plan, alignment))
