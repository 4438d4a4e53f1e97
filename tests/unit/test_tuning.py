"""The copy engine's tuning door (etptr.cuda._tuning): every field readable, changed only
through tune() / tuned(), checked, and put back."""
import pytest

import etptr
from etptr.cuda import _tuning


def test_values_name_every_field_and_the_chunk_hook():
    v = _tuning.values()
    assert {"target_chunks", "min_chunk", "fill_pieces", "ramp_first", "nt_max",
            "nt_file_max", "read_bounce", "stream_writes", "fence", "fence_max",
            "large_piece", "scattered_pipeline", "scratch_max", "near_gap", "trace",
            "chunk_hook"} <= set(v)
    assert v["chunk_hook"] is None and v["trace"] is False
    assert v["near_gap"] == 256 and v["fill_pieces"] == 8


def test_tune_returns_what_it_replaced_and_tuned_puts_it_back():
    before = _tuning.values()
    previous = _tuning.tune(fill_pieces=2, fence=False)
    try:
        assert previous == {"fill_pieces": before["fill_pieces"], "fence": before["fence"]}
        assert _tuning.values() == dict(before, fill_pieces=2, fence=False)
    finally:
        _tuning.tune(**previous)
    assert _tuning.values() == before
    with _tuning.tuned(nt_max=0, chunk_hook=print):
        assert _tuning.values()["nt_max"] == 0 and _tuning.values()["chunk_hook"] is print
    assert _tuning.values() == before


@pytest.mark.parametrize("kw, match", [
    (dict(fill_pieces=0), "fill_pieces"), (dict(fill_pieces=65), "fill_pieces"),
    (dict(read_bounce=(512 << 10) + 1), "read_bounce"), (dict(ramp_growth=100), "ramp_growth"),
    (dict(no_such_field=1), "no tuning field"), (dict(chunk_hook=3), "not callable"),
])
def test_bad_values_are_refused_and_change_nothing(kw, match):
    before = _tuning.values()
    with pytest.raises(etptr.InvalidArgumentError, match=match):
        _tuning.tune(min_chunk=1 << 16, **kw)
    assert _tuning.values() == before


def test_the_trace_is_empty_until_turned_on():
    assert _tuning.take_trace() == []
    with _tuning.tuned(trace=True):
        pass
    assert _tuning.take_trace() == []
