"""The safetensors header parser and the checkpoint plan: every rule, every refusal."""
import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import etptr
from etptr import Error, ScalarType
from etptr.checkpoint import CheckpointError, MAX_HEADER_BYTES, parse_header, read_plan

from _checkpoint_helpers import DTYPES, entry, random_array, reference_serialize, write_raw


def _refused(path, *fragments, tensor=None):
    """parse_header(path) raises CheckpointError naming the file, the tensor and each fragment."""
    with pytest.raises(CheckpointError) as info:
        parse_header(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    if tensor is not None:
        assert repr(tensor) in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


# ------------------------------------------------------------------ the exception

def test_checkpoint_error_is_an_et_error_and_a_value_error():
    assert etptr.CheckpointError is CheckpointError
    assert issubclass(CheckpointError, etptr.EtError)
    assert issubclass(CheckpointError, ValueError)
    err = CheckpointError("model.safetensors: tensor 'w': bad")
    assert err.error == Error.InvalidExternalData
    assert CheckpointError.__module__ == "etptr"


def test_checkpoint_error_pickles():
    err = CheckpointError("f: tensor 'w': bad")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CheckpointError
    assert str(back) == str(err) and back.error == Error.InvalidExternalData


# ------------------------------------------------------------------ valid headers

def test_reference_file_of_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"t_{code.lower()}": random_array(code, (2, 3), rng) for code in DTYPES}
    path = tmp_path / "all.safetensors"
    path.write_bytes(reference_serialize(arrays, metadata={"format": "np"}))
    plan = parse_header(path)
    assert plan.metadata == {"format": "np"}
    assert plan.file_size == path.stat().st_size
    assert plan.data_offset % 8 == 0
    assert plan.data_size == plan.file_size - plan.data_offset == sum(a.nbytes for a in arrays.values())
    by_name = {t.name: t for t in plan.tensors}
    for code, (st, _) in DTYPES.items():
        t = by_name[f"t_{code.lower()}"]
        assert t.scalar_type == st and t.shape == (2, 3)
        assert t.nbytes == 6 * etptr.element_size(st)
    begins = [t.begin for t in plan.tensors]
    assert begins == sorted(begins)


def test_empty_header_without_data(tmp_path):
    plan = parse_header(write_raw(tmp_path / "e.safetensors", {}))
    assert plan.tensors == () and plan.data_size == 0 and plan.metadata is None


def test_metadata_only(tmp_path):
    plan = parse_header(write_raw(tmp_path / "m.safetensors", {"__metadata__": {"a": "b"}}))
    assert plan.tensors == () and plan.metadata == {"a": "b"}


def test_entries_come_back_in_file_order(tmp_path):
    header = {"z": entry("U8", [4], 0, 4), "a": entry("U8", [2], 6, 8), "m": entry("U8", [2], 4, 6)}
    plan = parse_header(write_raw(tmp_path / "o.safetensors", header, b"\0" * 8))
    assert [t.name for t in plan.tensors] == ["z", "m", "a"]


def test_zero_size_and_zero_dim_tensors(tmp_path):
    header = {
        "first": entry("F32", [0, 5], 0, 0),
        "scalar": entry("F64", [], 0, 8),
        "middle": entry("I32", [3, 0], 8, 8),
        "rest": entry("U8", [4], 8, 12),
        "last": entry("BF16", [0], 12, 12),
    }
    plan = parse_header(write_raw(tmp_path / "z.safetensors", header, b"\1" * 12))
    assert [t.name for t in plan.tensors] == ["first", "scalar", "middle", "rest", "last"]
    by_name = {t.name: t for t in plan.tensors}
    assert by_name["scalar"].shape == () and by_name["scalar"].nbytes == 8
    assert by_name["middle"].nbytes == 0


def test_unpadded_header_and_surrounding_whitespace(tmp_path):
    text = ' \n{"t": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]}}\t\r\n'
    plan = parse_header(write_raw(tmp_path / "w.safetensors", text, b"\0" * 4, pad=False))
    assert plan.data_offset == 8 + len(text.encode())
    assert plan.tensors[0].scalar_type == ScalarType.Short


def test_sixteen_dims_and_large_sizes(tmp_path):
    header = {"t": entry("U8", [1] * 15 + [3], 0, 3),
              "big": entry("F32", [0, 2**62], 3, 3)}
    plan = parse_header(write_raw(tmp_path / "d.safetensors", header, b"abc"))
    assert {t.name: t.shape for t in plan.tensors}["t"] == tuple([1] * 15 + [3])


def test_unicode_names(tmp_path):
    header = {"é.权重": entry("U8", [1], 0, 1)}
    plan = parse_header(write_raw(tmp_path / "u.safetensors", header, b"\0"))
    assert plan.tensors[0].name == "é.权重"


# ------------------------------------------------------------------ file-level refusals

def test_missing_file(tmp_path):
    _refused(tmp_path / "nope.safetensors", "no such file")


def test_directory(tmp_path):
    (tmp_path / "d.safetensors").mkdir()
    _refused(tmp_path / "d.safetensors", "is a directory")


def test_fifo_is_not_a_regular_file(tmp_path):
    path = tmp_path / "p.safetensors"
    os.mkfifo(path)
    _refused(path, "not a regular file")


@pytest.mark.parametrize("n", range(8))
def test_shorter_than_eight_bytes(tmp_path, n):
    path = tmp_path / "s.safetensors"
    path.write_bytes(b"\x02" * n)
    _refused(path, f"{n} bytes long", "too short")


def test_header_length_past_the_end(tmp_path):
    path = write_raw(tmp_path / "l.safetensors", {}, length=1000)
    _refused(path, "1000 bytes runs past the end of the file")
    with pytest.raises(CheckpointError) as info:     # its header starts like JSON
        parse_header(path)
    assert "does not look like a safetensors file" not in str(info.value)


@pytest.mark.parametrize("text", [b"hello world, this is text\n", b"PK\x03\x04" + bytes(60)])
def test_a_file_of_another_format_says_so(tmp_path, text):
    path = tmp_path / "other.safetensors"
    path.write_bytes(text)
    _refused(path, "header length", "does not look like a safetensors file")


@pytest.mark.parametrize("length", [MAX_HEADER_BYTES + 1, 2**63, 2**64 - 1])
def test_header_over_100_mb(tmp_path, length):
    path = write_raw(tmp_path / "h.safetensors", {}, length=length)
    _refused(path, f"{length} bytes is over", str(MAX_HEADER_BYTES))


def test_header_not_utf8(tmp_path):
    path = write_raw(tmp_path / "x.safetensors", b'{"t\xff": 1}')
    _refused(path, "not UTF-8")


def test_header_with_a_byte_order_mark(tmp_path):
    path = write_raw(tmp_path / "x.safetensors", b"\xef\xbb\xbf{}")
    _refused(path, "not valid JSON")


@pytest.mark.parametrize("text", ['{"t": ', "{'t': 1}", '{"t": 1} x', "", "   ", '{"t": NaN}',
                                  '{"t": Infinity}', '{"a": -Infinity}'])
def test_header_not_json(tmp_path, text):
    path = write_raw(tmp_path / "j.safetensors", text)
    msg = _refused(path)
    assert "JSON" in msg or "refused" in msg


@pytest.mark.parametrize("text, kind", [("[]", "list"), ('"str"', "str"), ("3", "int"),
                                        ("null", "NoneType"), ("true", "bool")])
def test_header_not_an_object(tmp_path, text, kind):
    _refused(write_raw(tmp_path / "a.safetensors", text), f"a JSON {kind}, not an object")


def test_duplicate_key(tmp_path):
    text = '{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "t": 3}'
    _refused(write_raw(tmp_path / "d.safetensors", text, b"\0"), "'t' occurs twice")


def test_deep_nesting(tmp_path):
    depth = 200_000
    text = '{"t": ' + "[" * depth + "]" * depth + "}"
    _refused(write_raw(tmp_path / "n.safetensors", text), "nests too deeply")


def test_integer_with_too_many_digits(tmp_path):
    text = '{"t": {"dtype": "U8", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 1]}}'
    _refused(write_raw(tmp_path / "i.safetensors", text), "5000 digits", "past int64")


# ------------------------------------------------------------------ entry-level refusals

@pytest.mark.parametrize("value, kind", [([1, 2], "list"), ("F32", "str"), (None, "NoneType"),
                                         (7, "int")])
def test_entry_not_an_object(tmp_path, value, kind):
    path = write_raw(tmp_path / "e.safetensors", {"w": value})
    _refused(path, f"a JSON {kind}, not an object", tensor="w")


@pytest.mark.parametrize("missing", ["dtype", "shape", "data_offsets"])
def test_entry_lacks_a_key(tmp_path, missing):
    e = entry("U8", [1], 0, 1)
    del e[missing]
    path = write_raw(tmp_path / "k.safetensors", {"w": e}, b"\0")
    _refused(path, f"lacks {missing!r}", tensor="w")


def test_entry_with_an_extra_key(tmp_path):
    e = dict(entry("U8", [1], 0, 1), offsets=[0, 1])
    path = write_raw(tmp_path / "k.safetensors", {"w": e}, b"\0")
    _refused(path, "unexpected key(s) 'offsets'", tensor="w")


@pytest.mark.parametrize("dtype", ["F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64", "F8_E4M3FNUZ",
                                   "F8_E5M2FNUZ"])
def test_format_dtypes_without_a_scalar_type(tmp_path, dtype):
    path = write_raw(tmp_path / "u.safetensors", {"w": entry(dtype, [1], 0, 1)}, b"\0")
    _refused(path, repr(dtype), "no etptr ScalarType", tensor="w")


@pytest.mark.parametrize("dtype", ["F33", "float32", "bf16", "", "BF16 "])
def test_unknown_dtype(tmp_path, dtype):
    path = write_raw(tmp_path / "u.safetensors", {"w": entry(dtype, [1], 0, 1)}, b"\0")
    _refused(path, repr(dtype), "is not a safetensors dtype", tensor="w")


@pytest.mark.parametrize("dtype", [3, None, ["F32"], {"F32": 1}])
def test_dtype_not_a_string(tmp_path, dtype):
    path = write_raw(tmp_path / "u.safetensors", {"w": entry("U8", [1], 0, 1) | {"dtype": dtype}},
                     b"\0")
    _refused(path, "is not a string", tensor="w")


@pytest.mark.parametrize("shape", ["3", 3, None, {"0": 1}, [True], [1.0], [-1], [2, "2"],
                                   [[1]], [None]])
def test_shape_not_a_list_of_non_negative_ints(tmp_path, shape):
    e = {"dtype": "U8", "shape": shape, "data_offsets": [0, 1]}
    path = write_raw(tmp_path / "s.safetensors", {"w": e}, b"\0")
    _refused(path, "shape", "list", tensor="w")


def test_more_than_sixteen_dims(tmp_path):
    path = write_raw(tmp_path / "s.safetensors", {"w": entry("U8", [1] * 17, 0, 1)}, b"\0")
    _refused(path, "17 dims", tensor="w")


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**63], [0, 2**62, 4], [2**63 - 1, 2]])
def test_element_count_overflows_int64(tmp_path, shape):
    path = write_raw(tmp_path / "s.safetensors", {"w": entry("U8", shape, 0, 1)}, b"\0")
    _refused(path, "element count overflows int64", tensor="w")


def test_byte_count_overflows_int64(tmp_path):
    path = write_raw(tmp_path / "s.safetensors", {"w": entry("F32", [2**62], 0, 1)}, b"\0")
    _refused(path, "byte count overflows int64", tensor="w")


@pytest.mark.parametrize("offsets", ["0,1", None, [0], [0, 1, 2], [0.0, 1], [False, True],
                                     [0, "1"], {"0": 1}])
def test_offsets_not_two_ints(tmp_path, offsets):
    e = {"dtype": "U8", "shape": [1], "data_offsets": offsets}
    path = write_raw(tmp_path / "o.safetensors", {"w": e}, b"\0")
    _refused(path, "is not a list of two ints", tensor="w")


@pytest.mark.parametrize("offsets", [[1, 0], [-1, 0], [-2, -1]])
def test_offsets_out_of_order_or_negative(tmp_path, offsets):
    e = {"dtype": "U8", "shape": [1], "data_offsets": offsets}
    path = write_raw(tmp_path / "o.safetensors", {"w": e}, b"\0")
    _refused(path, "need 0 <= begin <= end", tensor="w")


def test_shape_disagrees_with_offsets(tmp_path):
    path = write_raw(tmp_path / "m.safetensors", {"w": entry("F32", [2, 2], 0, 8)}, b"\0" * 8)
    _refused(path, "needs 16 bytes", "hold 8", tensor="w")


def test_offsets_overlap(tmp_path):
    header = {"a": entry("U8", [8], 0, 8), "b": entry("U8", [8], 4, 12)}
    path = write_raw(tmp_path / "v.safetensors", header, b"\0" * 12)
    _refused(path, "overlap those of tensor 'a'", tensor="b")


def test_identical_offsets_overlap(tmp_path):
    header = {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 0, 4)}
    path = write_raw(tmp_path / "v.safetensors", header, b"\0" * 4)
    _refused(path, "overlap", tensor="b")


def test_zero_size_tensor_inside_another(tmp_path):
    header = {"a": entry("U8", [8], 0, 8), "empty": entry("U8", [0], 3, 3)}
    path = write_raw(tmp_path / "v.safetensors", header, b"\0" * 8)
    _refused(path, "overlap those of tensor 'a'", tensor="empty")


def test_offsets_past_the_data_section(tmp_path):
    path = write_raw(tmp_path / "p.safetensors", {"w": entry("U8", [16], 0, 16)}, b"\0" * 8)
    _refused(path, "run past the end of the data section (8 bytes)", tensor="w")


def test_zero_size_tensor_past_the_data_section(tmp_path):
    header = {"a": entry("U8", [4], 0, 4), "w": entry("U8", [0], 9, 9)}
    path = write_raw(tmp_path / "p.safetensors", header, b"\0" * 4)
    _refused(path, "run past the end", tensor="w")


def test_gap_between_tensors(tmp_path):
    header = {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 8, 12)}
    path = write_raw(tmp_path / "g.safetensors", header, b"\0" * 12)
    _refused(path, "bytes [4, 8)", "belong to no tensor", tensor="b")


def test_gap_at_the_start(tmp_path):
    path = write_raw(tmp_path / "g.safetensors", {"b": entry("U8", [4], 4, 8)}, b"\0" * 8)
    _refused(path, "bytes [0, 4)", tensor="b")


def test_bytes_left_over_at_the_end(tmp_path):
    path = write_raw(tmp_path / "g.safetensors", {"a": entry("U8", [4], 0, 4)}, b"\0" * 9)
    _refused(path, "bytes [4, 9)", "after tensor 'a'")


def test_data_without_tensors(tmp_path):
    _refused(write_raw(tmp_path / "g.safetensors", {}, b"x"), "bytes [0, 1)", "belong to no tensor")


@pytest.mark.parametrize("metadata", [["a"], "a", 3, None])
def test_metadata_not_an_object(tmp_path, metadata):
    path = write_raw(tmp_path / "m.safetensors", {"__metadata__": metadata})
    _refused(path, "__metadata__ is a JSON")


@pytest.mark.parametrize("value", [1, None, ["x"], {"a": "b"}, True])
def test_metadata_value_not_a_string(tmp_path, value):
    path = write_raw(tmp_path / "m.safetensors", {"__metadata__": {"ok": "1", "k": value}})
    _refused(path, "__metadata__['k']", "is not a string")


def test_first_bad_entry_is_named(tmp_path):
    header = {"good": entry("U8", [1], 0, 1), "bad": entry("U8", [2], 1, 2)}
    _refused(write_raw(tmp_path / "f.safetensors", header, b"\0\0"), tensor="bad")


def test_load_safetensors_refuses_too(tmp_path):
    path = write_raw(tmp_path / "f.safetensors", {"w": entry("F32", [3], 0, 8)}, b"\0" * 8)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: tensor 'w'")):
        etptr.load_safetensors(path, "cpu")


# ------------------------------------------------------------------ paths, lists, indexes

def _shards(tmp_path, layout, weight_map=None, name="model.safetensors.index.json"):
    """Write shards {file: {tensor: nbytes}} and an index; returns the index path."""
    wm = {}
    for shard, tensors in layout.items():
        header, data, off = {}, b"", 0
        for t, n in tensors.items():
            header[t] = entry("U8", [n], off, off + n)
            data += bytes([len(data) % 251]) * n
            off += n
            wm[t] = shard
        write_raw(tmp_path / shard, header, data)
    index = tmp_path / name
    index.write_text(json.dumps({"metadata": {"total_size": 0},
                                 "weight_map": wm if weight_map is None else weight_map}))
    return index


def test_sharded_index(tmp_path):
    index = _shards(tmp_path, {"b-2.safetensors": {"x": 3, "y": 1}, "a-1.safetensors": {"w": 2}})
    plan = read_plan(index)
    assert [f.path.name for f in plan.files] == ["a-1.safetensors", "b-2.safetensors"]
    assert plan.names == ["w", "x", "y"] and plan.nbytes == 6


def test_index_as_path_object_and_in_a_list(tmp_path):
    index = _shards(tmp_path, {"s.safetensors": {"x": 3}})
    assert read_plan(Path(index)).names == ["x"]
    assert read_plan([str(index)]).names == ["x"]


def test_index_missing_shard(tmp_path):
    index = _shards(tmp_path, {"a.safetensors": {"w": 2}},
                    weight_map={"w": "a.safetensors", "v": "gone.safetensors"})
    with pytest.raises(CheckpointError, match=r"shard 'gone.safetensors' \(holding tensor 'v'"):
        read_plan(index)


def test_index_maps_a_name_to_a_shard_without_it(tmp_path):
    index = _shards(tmp_path, {"a.safetensors": {"w": 2}},
                    weight_map={"w": "a.safetensors", "v": "a.safetensors"})
    with pytest.raises(CheckpointError) as info:
        read_plan(index)
    assert str(index) in str(info.value)
    assert "tensor 'v' is mapped to shard 'a.safetensors', which does not hold it" in str(info.value)


def test_shard_holds_a_name_the_index_lacks(tmp_path):
    index = _shards(tmp_path, {"a.safetensors": {"w": 2, "extra": 1}},
                    weight_map={"w": "a.safetensors"})
    with pytest.raises(CheckpointError) as info:
        read_plan(index)
    msg = str(info.value)
    assert str(tmp_path / "a.safetensors") in msg and "tensor 'extra'" in msg
    assert "does not map it here" in msg


def test_shard_with_a_bad_header_fails_the_index(tmp_path):
    index = _shards(tmp_path, {"a.safetensors": {"w": 2}, "b.safetensors": {"v": 2}})
    write_raw(tmp_path / "b.safetensors", {"v": entry("U8", [3], 0, 3)}, b"\0\0")
    with pytest.raises(CheckpointError, match="b.safetensors: tensor 'v'"):
        read_plan(index)


@pytest.mark.parametrize("content, fragment", [
    ("{", "not a UTF-8 JSON index"),
    (b"\xff\xfe", "not a UTF-8 JSON index"),
    ("[]", "no \"weight_map\""),
    ('{"weight_map": []}', "no \"weight_map\""),
    ('{"metadata": {}}', "no \"weight_map\""),
    ('{"weight_map": {}}', "weight_map is empty"),
    ('{"weight_map": {"w": 3}}', "tensor 'w': weight_map gives 3"),
    ('{"weight_map": {"w": "../a.safetensors"}}', "not the name of a shard file"),
    ('{"weight_map": {"w": "/abs/a.safetensors"}}', "not the name of a shard file"),
    ('{"weight_map": {"w": ".."}}', "not the name of a shard file"),
    ('{"weight_map": {"w": "a", "w": "b"}}', "occurs twice"),
])
def test_bad_index(tmp_path, content, fragment):
    index = tmp_path / "m.safetensors.index.json"
    index.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(CheckpointError) as info:
        read_plan(index)
    assert str(index) in str(info.value) and fragment in str(info.value)


def test_missing_index(tmp_path):
    with pytest.raises(CheckpointError, match="no such index file"):
        read_plan(tmp_path / "none.safetensors.index.json")


def test_same_name_in_two_files(tmp_path):
    a = write_raw(tmp_path / "a.safetensors", {"w": entry("U8", [1], 0, 1)}, b"\0")
    b = write_raw(tmp_path / "b.safetensors", {"w": entry("U8", [1], 0, 1)}, b"\0")
    with pytest.raises(CheckpointError) as info:
        read_plan([a, b])
    assert str(b) in str(info.value) and "tensor 'w' is also in" in str(info.value)
    assert str(a) in str(info.value)


def test_same_file_twice(tmp_path):
    a = write_raw(tmp_path / "a.safetensors", {}, b"")
    with pytest.raises(CheckpointError, match="named twice"):
        read_plan([a, str(a)])


def test_list_of_files_keeps_order(tmp_path):
    b = write_raw(tmp_path / "b.safetensors", {"y": entry("U8", [1], 0, 1)}, b"\0")
    a = write_raw(tmp_path / "a.safetensors", {"x": entry("U8", [1], 0, 1)}, b"\0")
    plan = read_plan((b, a))
    assert plan.names == ["y", "x"]


@pytest.mark.parametrize("paths, fragment", [([], "paths=[]"), (3, "paths=3"),
                                             (b"a.safetensors", "paths=b'a.safetensors'"),
                                             ([3], "paths[0]=3"), ("", "paths=''"),
                                             (None, "paths=None")])
def test_bad_paths_argument(paths, fragment):
    with pytest.raises(CheckpointError, match=re.escape(fragment)):
        read_plan(paths)


def test_one_missing_file_in_a_list_fails_before_anything(tmp_path):
    a = write_raw(tmp_path / "a.safetensors", {"x": entry("U8", [1], 0, 1)}, b"\0")
    with pytest.raises(CheckpointError, match="no such file"):
        etptr.load_safetensors([a, tmp_path / "missing.safetensors"], "cpu")


# ------------------------------------------------------------------ select

def test_select_keeps_file_order_and_drops_empty_files(tmp_path):
    a = write_raw(tmp_path / "a.safetensors",
                  {"x": entry("U8", [1], 0, 1), "y": entry("U8", [1], 1, 2)}, b"\0\0")
    b = write_raw(tmp_path / "b.safetensors", {"z": entry("U8", [1], 0, 1)}, b"\0")
    plan = read_plan([a, b]).select(["y", "x", "y"])
    assert plan.names == ["x", "y"] and len(plan.files) == 1
    assert plan.files[0].data_size == 2       # offsets still refer to the whole file


def test_select_unknown_name_lists_close_names(tmp_path):
    header = {"model.layers.0.mlp.up_proj.weight": entry("U8", [1], 0, 1),
              "model.layers.0.mlp.down_proj.weight": entry("U8", [1], 1, 2)}
    plan = read_plan(write_raw(tmp_path / "a.safetensors", header, b"\0\0"))
    with pytest.raises(CheckpointError) as info:
        plan.select(["model.layers.0.mlp.up_prj.weight"])
    msg = str(info.value)
    assert "no tensor named 'model.layers.0.mlp.up_prj.weight'" in msg
    assert "'model.layers.0.mlp.up_proj.weight'" in msg and str(tmp_path / "a.safetensors") in msg


def test_select_unknown_name_without_close_names(tmp_path):
    plan = read_plan(write_raw(tmp_path / "a.safetensors", {"w": entry("U8", [1], 0, 1)}, b"\0"))
    with pytest.raises(CheckpointError, match=r"no tensor named 'zzzz' \(it holds 1 tensors"):
        plan.select(["zzzz"])


@pytest.mark.parametrize("names", ["w", 3, [3], [b"w"]])
def test_select_bad_names_argument(tmp_path, names):
    plan = read_plan(write_raw(tmp_path / "a.safetensors", {"w": entry("U8", [1], 0, 1)}, b"\0"))
    with pytest.raises(CheckpointError, match="names"):
        plan.select(names)


# (entry, None when it is accepted or a fragment of the message that refuses it), for a
# data section of 110 bytes
_EDGE_ENTRIES = [
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, None),
    ({"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, None),
    ({"dtype": "F32", "shape": [0, 5], "data_offsets": [7, 7]}, None),
    ({"dtype": "BF16", "shape": [3], "data_offsets": [2, 8]}, None),
    ({"dtype": "F32", "shape": [True, 3], "data_offsets": [0, 12]}, "not a list of non-negative"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0.0, 24]}, "not a list of two ints"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24], "x": 1}, "unexpected key(s) 'x'"),
    ({"dtype": "F32", "shape": [2, 3], "offsets": [0, 24]}, "lacks 'data_offsets'"),
    ({"dtype": "F32", "shape": [0, 1 << 62, 1 << 62], "data_offsets": [0, 0]},
     "element count overflows int64"),
    ({"dtype": "F32", "shape": [1 << 61], "data_offsets": [0, 1 << 63]},
     "byte count overflows int64"),
    ({"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}, "not a list of non-negative"),
    ({"dtype": "F32", "shape": [1] * 17, "data_offsets": [0, 4]}, "more than the 16"),
    ({"dtype": "F32", "shape": (2, 3), "data_offsets": [0, 24]}, "is not a list of ints"),
    ({"dtype": "f32", "shape": [2, 3], "data_offsets": [0, 24]}, "not a safetensors dtype"),
    ({"dtype": 7, "shape": [2], "data_offsets": [0, 8]}, "is not a string"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [24, 0]}, "need 0 <= begin <= end"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 25]}, "needs 24 bytes"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [100, 124]}, "run past the end"),
    (["F32"], "is a JSON list, not an object"),
]


@pytest.mark.parametrize("entry, refused", _EDGE_ENTRIES, ids=lambda e: str(e)[:60])
def test_entry_check_on_edge_entries(entry, refused):
    from etptr.checkpoint import _format
    path = Path("x.safetensors")
    if refused is None:
        t = _format._check_entry(path, "t", entry, 110)
        assert (t.shape, t.begin, t.end) == (tuple(entry["shape"]), *entry["data_offsets"])
        assert t.scalar_type == _format.SAFETENSORS_DTYPES[entry["dtype"]]
    else:
        with pytest.raises(CheckpointError, match=re.escape(refused)):
            _format._check_entry(path, "t", entry, 110)


# ------------------------------------------------------------------ the one-pass fast path

def _fast_and_full(raw, data_size):
    """(fast path's result, full reader's result or the CheckpointError it raised)."""
    from etptr.checkpoint import _format
    from etptr.checkpoint._header_scan import scan_header
    fast = scan_header(raw, data_size, _format._DTYPE_INFO)
    try:
        full = _format._check_header(Path("x.safetensors"), raw, data_size)
    except CheckpointError as exc:
        full = exc
    return fast, full


_T = '"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
# (header JSON, data section bytes, whether the fast path reads it); the full reader
# decides every header the fast path leaves
_FAST_CASES = [
    ("{" + _T + "}", 8, True),
    ('{"__metadata__":{"format":"pt","k":""},' + _T + "}", 8, True),
    ('{"__metadata__":{},' + _T + "}", 8, True),
    ("{}", 0, True),
    ('{"__metadata__":{"a":"b"}}', 0, True),
    (' \t\n{ "t" : { "shape" : [ 2 ] ,\r"data_offsets":[ 0 , 8 ],"dtype":"F32" } }  \n ', 8, True),
    ('{"é😀":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}', 1, True),
    ('{"z":{"dtype":"F32","shape":[0,5],"data_offsets":[8,8]},' + _T + "}", 8, True),
    ('{"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', 8,
     True),
    # what the fast path leaves to the full reader, which accepts it
    ('{"t\\u00e9":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[-0,2],"data_offsets":[0,0]}}', 0, False),
    ('{"__metadata__":{"k":"a\\"b"},' + _T + "}", 8, False),
    # broken rules: the full reader refuses, naming them
    ('{"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"U8","shape":[0],"data_offsets":[0000000000000000000,0]}}', 0, False),
    ('{"t":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"F32"}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', 8, False),
    ("{" + _T + "," + _T + "}", 8, False),
    ('{"__metadata__":{},"__metadata__":{},' + _T + "}", 8, False),
    ('{"__metadata__":{"k":"v","k":"w"},' + _T + "}", 8, False),
    ('{"__metadata__":{"k":1},' + _T + "}", 8, False),
    ('{"__metadata__":[],' + _T + "}", 8, False),
    ('{"t":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":true,"shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', 8,
     False),
    ('{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 12, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 4, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
     '"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12, False),
    ('{"t":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}x', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2] "data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}', 8, False),
    ('["t"]', 0, False),
    ("", 0, False),
    ('\ufeff{}', 0, False),
    ('{"t\x01":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, False),
    ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\x00', 8, False),
]


@pytest.mark.parametrize("text, data_size, fast", _FAST_CASES, ids=lambda c: str(c)[:50])
def test_fast_path_reads_what_writers_make_and_leaves_the_rest(text, data_size, fast):
    got, full = _fast_and_full(text.encode("utf-8"), data_size)
    if fast:
        assert got is not None and not isinstance(full, CheckpointError)
    else:
        assert got is None
    if got is not None:
        assert got == full            # the same tensors, in the same order, and metadata


@pytest.mark.parametrize("raw", [b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                 b'{"a\xc3":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                 b'{"\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                 b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\xa0'])
def test_fast_path_leaves_bytes_that_are_not_utf8(raw):
    got, full = _fast_and_full(raw, 1)
    assert got is None and isinstance(full, CheckpointError)


def test_fast_path_reads_reference_files_of_every_dtype(tmp_path):
    from etptr.checkpoint import _format
    rng = np.random.default_rng(1)
    arrays = {f"model.layers.{i}.{code.lower()}": random_array(code, (i + 1, 3), rng)
              for i, code in enumerate(DTYPES)}
    blob = reference_serialize(arrays, metadata={"format": "pt"})
    n = int.from_bytes(blob[:8], "little")
    got, full = _fast_and_full(blob[8:8 + n], len(blob) - 8 - n)
    assert got is not None and got == full
    assert len(got[0]) == len(DTYPES) and got[1] == {"format": "pt"}
    path = tmp_path / "a.safetensors"
    path.write_bytes(blob)
    assert parse_header(path).tensors == got[0]


def test_tensor_entry_is_immutable_and_compares_by_value():
    from etptr.checkpoint import TensorEntry
    a = TensorEntry("w", ScalarType.Float, (2, 3), 0, 24)
    b = TensorEntry("w", ScalarType.Float, (2, 3), 0, 24)
    assert a == b and hash(a) == hash(b) and a.nbytes == 24
    assert a != TensorEntry("w", ScalarType.Float, (2, 3), 24, 48) and a != ("w",)
    assert pickle.loads(pickle.dumps(a)) == a
    assert "name='w'" in repr(a) and "shape=(2, 3)" in repr(a)
    with pytest.raises(AttributeError):
        a.begin = 5
    with pytest.raises(TypeError):
        TensorEntry("w", ScalarType.Float, [2, 3], 0, 24)


def test_fast_path_checks_its_own_arguments():
    from etptr.checkpoint import _format
    from etptr.checkpoint._header_scan import scan_header
    raw = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    assert scan_header(raw, 4, _format._DTYPE_INFO) is not None
    for bad in ({"F32": [ScalarType.Float, 4]}, {"F32": (ScalarType.Float, 0)},
                {"F32": (ScalarType.Float, 4.0)}, {"F32": (ScalarType.Float,)}, {"F32": 4}):
        with pytest.raises(etptr.InvalidArgumentError, match="dtypes"):
            scan_header(raw, 4, bad)
    with pytest.raises(TypeError):
        scan_header(raw, 4.9, _format._DTYPE_INFO)        # not truncated to 4
    with pytest.raises(TypeError):
        scan_header(raw.decode(), 4, _format._DTYPE_INFO)
    assert scan_header(raw, -1, _format._DTYPE_INFO) is None
    assert scan_header(raw, 2**63, _format._DTYPE_INFO) is None


def test_tensor_entry_checks_its_offsets_and_keeps_python_ints():
    import weakref
    from etptr.checkpoint import TensorEntry
    big = TensorEntry("w", ScalarType.Byte, (2**63 - 1,), 0, 2**63 - 1)
    assert big.nbytes == 2**63 - 1
    for begin, end in ((-1, 4), (8, 4), (0, 2**63)):
        with pytest.raises(etptr.InvalidArgumentError, match="begin"):
            TensorEntry("w", ScalarType.Byte, (4,), begin, end)
    with pytest.raises(TypeError):
        TensorEntry("w", ScalarType.Byte, (4,), 1.5, 5)
    e = TensorEntry("w", ScalarType.Float, (2,), 0, 8)
    assert weakref.ref(e)() is e
    match e:
        case TensorEntry(name, st, shape, begin, end):
            assert (name, st, shape, begin, end) == ("w", ScalarType.Float, (2,), 0, 8)


# ------------------------------------------------------------------ the layout hint

@pytest.mark.parametrize("seed", range(12))
def test_offsets_hint_agrees_with_the_layout(tmp_path, seed):
    # offsets_aligned (read from the bytes, unchecked) says True exactly where the
    # checked header's device layout is the file's own
    from etptr.checkpoint._format import _read_header_bytes
    from etptr.checkpoint._header_scan import offsets_aligned
    from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
    rng = np.random.default_rng(seed)
    codes = list(DTYPES)
    arrays = {}
    for i in range(int(rng.integers(1, 8))):
        code = codes[int(rng.integers(len(codes)))]
        shape = tuple(int(d) for d in rng.choice([0, 1, 3, 16, 64, 128], int(rng.integers(0, 3))))
        arrays[f"t{i}"] = random_array(code, shape, rng)
    path = tmp_path / "m.safetensors"
    path.write_bytes(reference_serialize(arrays))
    plan = parse_header(path)
    layout = layout_file(plan, DEVICE_ALIGNMENT)
    own = plan.data_size == 0 or (len(layout.runs) == 1 and layout.runs[0].buffer_offset == 0
                                  and layout.nbytes == plan.data_size)
    raw = _read_header_bytes(Path(path))[0]
    assert offsets_aligned(raw, DEVICE_ALIGNMENT) is own


@pytest.mark.parametrize("raw, aligned", [
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', False),
    (b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}', True),         # no bytes
    (b'{"a":{"data_offsets" : [ 512 , 1024 ]},"b":{"data_offsets":[1024,1030]}}', True),
    (b'{"a":{"data_offsets":[512,1024]},"b":{"data_offsets":[1030,1040]}}', False),
    (b'{"a":{"data_offsets":[1.5e3,2000]}}', True),                           # unread
    (b'"data_offsets', True),
    (b'', True),
])
def test_offsets_hint_cases(raw, aligned):
    from etptr.checkpoint._header_scan import offsets_aligned
    assert offsets_aligned(raw, 256) is aligned
    for bad in (0, -256, 0.5, 256.0, True, 1 << 63, "256"):
        with pytest.raises(etptr.InvalidArgumentError, match="alignment="):
            offsets_aligned(raw, bad)


def test_messages_show_huge_values_cut_short(tmp_path):
    deep = [0]
    for _ in range(200):
        deep = [deep]
    long = {"a": {"dtype": "X" * 100_000, "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": deep, "data_offsets": [4, 8]}}
    for name, value in long.items():
        path = write_raw(tmp_path / f"{name}.safetensors", {name: value}, bytes(4))
        with pytest.raises(CheckpointError) as info:
            parse_header(path)
        assert len(str(info.value)) < 400 and f"tensor {name!r}" in str(info.value)


# ------------------------------------------------------------------ refusals name the tensor

@pytest.mark.parametrize("text, why", [
    ('{"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
     "the key 'dtype' occurs twice in one object"),
    ('{"w":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', "NaN is not JSON"),
    ('{"w":{"dtype":"F32","shape":[12345678901234567890123456],"data_offsets":[0,4]}}',
     "an integer of 26 digits"),
    ('{"v":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
     '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{"a":1,"a":2}}}',
     "the key 'a' occurs twice"),
])
def test_a_refusal_inside_an_entry_names_the_tensor(tmp_path, text, why):
    path = write_raw(tmp_path / "r.safetensors", text.encode(), bytes(4))
    with pytest.raises(CheckpointError, match=re.escape(f"tensor 'w': the header is refused: {why}")):
        parse_header(path)


def test_a_name_repeated_at_the_top_names_itself(tmp_path):
    text = b'{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{}}'
    path = write_raw(tmp_path / "r.safetensors", text, bytes(4))
    with pytest.raises(CheckpointError, match="the key 'w' occurs twice in one object"):
        parse_header(path)


@pytest.mark.parametrize("text, what", [
    (b'{"w\\ud800":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', "the name 'w\\\\ud800'"),
    (b'{"__metadata__":{"k":"v\\udfff"},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
     r"__metadata__\['k'\]"),
])
def test_text_that_is_not_unicode_is_refused(tmp_path, text, what):
    # a lone surrogate escape decodes to a str that no UTF-8 can hold: save_safetensors
    # refuses such a name, and so does the reader
    path = write_raw(tmp_path / "s.safetensors", text, bytes(4))
    with pytest.raises(CheckpointError, match=what + ".* not valid Unicode"):
        parse_header(path)
    with pytest.raises(CheckpointError, match="not valid Unicode"):
        etptr.load_safetensors(path, "cpu")


@pytest.mark.parametrize("call", ["parse_header", "read_plan", "load", "index", "save"])
def test_a_nul_byte_in_a_path_is_a_checkpoint_error(tmp_path, call):
    bad = str(tmp_path / "a\0b.safetensors")
    if call == "index":
        call, bad = "load", bad + ".index.json"
    with pytest.raises(CheckpointError, match="NUL"):
        if call == "parse_header":
            parse_header(bad)
        elif call == "read_plan":
            read_plan([bad])
        elif call == "load":
            etptr.load_safetensors(bad, "cpu")
        else:
            etptr.save_safetensors({"a": etptr.ones([2])}, bad)
