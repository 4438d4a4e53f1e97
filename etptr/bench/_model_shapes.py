"""Checkpoints shaped like public models, with random contents, for benchmarks.

A layout is the list of tensor names and shapes of a model's safetensors
checkpoint (Hugging Face names), all of one floating-point type (bf16 for the
decoders, fp32 for all-MiniLM-L6-v2, as the published checkpoints). :func:`write_layout` writes one
with random contents through :func:`etptr.save_safetensors`, so benchmarks
can load a checkpoint of a real model's size and tensor mix without
downloading it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from etptr._core._scalar_type import ScalarType
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint import CheckpointError, save_safetensors

__all__ = ["LAYOUTS", "ModelLayout", "bert_layout", "qwen2_layout", "write_layout"]

_ELEMENT_BYTES = {ScalarType.BFloat16: 2, ScalarType.Float: 4}
# random bits are made in pieces of this many bytes
_PIECE = 64 << 20


@dataclass(frozen=True)
class ModelLayout:
    """The tensors of one model's checkpoint, all bf16.

    Attributes
    ----------
    name : str
        Also the file name's stem.
    description : str
        One line: the model, the tensor count and the byte total.
    shapes : tuple of (str, tuple of int)
        Tensor name and shape (in elements), in definition order.
    """

    name: str
    description: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    scalar_type: ScalarType = ScalarType.BFloat16

    @property
    def tensors(self) -> int:
        """How many tensors the checkpoint holds."""
        return len(self.shapes)

    @property
    def element_size(self) -> int:
        """Bytes per element: 2 (bf16) or 4 (fp32)."""
        return _ELEMENT_BYTES[self.scalar_type]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return sum(self.element_size * int(np.prod(s, dtype=np.int64)) for _, s in self.shapes)


def _check_sizes(**sizes: int) -> None:
    for arg, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(f"{arg}={value!r} is not a positive int")


def qwen2_layout(name: str, *, hidden: int, layers: int, intermediate: int, heads: int,
                 kv_heads: int, head_dim: int, vocab: int, tied: bool = True,
                 title: str | None = None) -> ModelLayout:
    """The checkpoint layout of a Qwen2-architecture decoder.

    Per layer: q/k/v projections with biases (q: ``heads * head_dim`` rows,
    k and v: ``kv_heads * head_dim`` rows), the o projection, the gated MLP
    (gate, up: ``intermediate`` rows; down: ``hidden`` rows) and two RMS
    norms; plus the token embedding, the final norm and, unless the
    embeddings are tied, ``lm_head``.

    Parameters
    ----------
    name : str
    hidden, layers, intermediate, heads, kv_heads, head_dim, vocab : int
        The model's configuration (sizes in elements).
    tied : bool
        Tied embeddings: no ``lm_head.weight``.
    title : str, optional
        The model's name in the description (default ``name``).

    Raises
    ------
    CheckpointError
        A size that is not a positive int.
    """
    _check_sizes(hidden=hidden, layers=layers, intermediate=intermediate, heads=heads,
                 kv_heads=kv_heads, head_dim=head_dim, vocab=vocab)
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (q, hidden)), (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, q)),
            (p + "mlp.gate_proj.weight", (intermediate, hidden)),
            (p + "mlp.up_proj.weight", (intermediate, hidden)),
            (p + "mlp.down_proj.weight", (hidden, intermediate)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    shapes.append(("model.norm.weight", (hidden,)))
    if not tied:
        shapes.append(("lm_head.weight", (vocab, hidden)))
    layout = ModelLayout(name, "", tuple(shapes))
    description = (f"{title or name}: {layout.tensors} bf16 tensors, {layout.nbytes:,} bytes "
                   f"({layout.nbytes / 1e9:.2f} GB)")
    return ModelLayout(name, description, layout.shapes)


def bert_layout(name: str, *, hidden: int, layers: int, intermediate: int, vocab: int,
                positions: int, type_vocab: int, title: str | None = None) -> ModelLayout:
    """The checkpoint layout of a BERT encoder with a pooler, fp32 (as
    sentence-transformers publish all-MiniLM-L6-v2; its int64 ``position_ids``
    buffer, 4 KiB there, is fp32 here).

    Raises
    ------
    CheckpointError
        A size that is not a positive int.
    """
    _check_sizes(hidden=hidden, layers=layers, intermediate=intermediate, vocab=vocab,
                 positions=positions, type_vocab=type_vocab)
    e = "embeddings."
    shapes: list[tuple[str, tuple[int, ...]]] = [
        (e + "position_ids", (1, positions)),
        (e + "word_embeddings.weight", (vocab, hidden)),
        (e + "position_embeddings.weight", (positions, hidden)),
        (e + "token_type_embeddings.weight", (type_vocab, hidden)),
        (e + "LayerNorm.weight", (hidden,)), (e + "LayerNorm.bias", (hidden,)),
    ]
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            shapes += [(p + f"attention.self.{part}.weight", (hidden, hidden)),
                       (p + f"attention.self.{part}.bias", (hidden,))]
        shapes += [
            (p + "attention.output.dense.weight", (hidden, hidden)),
            (p + "attention.output.dense.bias", (hidden,)),
            (p + "attention.output.LayerNorm.weight", (hidden,)),
            (p + "attention.output.LayerNorm.bias", (hidden,)),
            (p + "intermediate.dense.weight", (intermediate, hidden)),
            (p + "intermediate.dense.bias", (intermediate,)),
            (p + "output.dense.weight", (hidden, intermediate)),
            (p + "output.dense.bias", (hidden,)),
            (p + "output.LayerNorm.weight", (hidden,)),
            (p + "output.LayerNorm.bias", (hidden,)),
        ]
    shapes += [("pooler.dense.weight", (hidden, hidden)), ("pooler.dense.bias", (hidden,))]
    layout = ModelLayout(name, "", tuple(shapes), ScalarType.Float)
    description = (f"{title or name}: {layout.tensors} fp32 tensors, {layout.nbytes:,} bytes "
                   f"({layout.nbytes / 1e6:.1f} MB)")
    return ModelLayout(name, description, layout.shapes, ScalarType.Float)


#: name -> layout of the public models etptr-bench can imitate.
LAYOUTS: dict[str, ModelLayout] = {
    layout.name: layout for layout in (
        qwen2_layout("qwen2.5-0.5b", hidden=896, layers=24, intermediate=4864, heads=14,
                     kv_heads=2, head_dim=64, vocab=151936, title="Qwen2.5-0.5B"),
        qwen2_layout("qwen2.5-1.5b", hidden=1536, layers=28, intermediate=8960, heads=12,
                     kv_heads=2, head_dim=128, vocab=151936, title="Qwen2.5-1.5B"),
        bert_layout("all-minilm-l6-v2", hidden=384, layers=6, intermediate=1536, vocab=30522,
                    positions=512, type_vocab=2, title="all-MiniLM-L6-v2"),
    )
}


def _random_floats(nbytes: int, itemsize: int, seed: int) -> npt.NDArray[np.uint8]:
    """``nbytes`` bytes of random, finite bf16 (``itemsize`` 2) or fp32 (4) values in
    (-2, 2), made in large pieces."""
    out = np.empty(nbytes, dtype=np.uint8)
    gen = np.random.SFC64(seed)
    for start in range(0, nbytes, _PIECE):
        n = min(_PIECE, nbytes - start)
        words = (n + 7) // 8
        raw = gen.random_raw(words).view(np.uint8)[:n]
        piece = out[start:start + n]
        piece[:] = raw
        # clear each value's top exponent bit (in its last byte): no inf or NaN, |x| < 2
        piece[itemsize - 1::itemsize] &= 0xBF
    return out


def write_layout(name: str | ModelLayout, directory: str | os.PathLike[str], *,
                 seed: int = 0) -> Path:
    """Write a checkpoint with a model's tensor names, shapes and type, random contents.

    Parameters
    ----------
    name : str or ModelLayout
        A key of :data:`LAYOUTS` (e.g. ``"qwen2.5-0.5b"``), or a layout.
    directory : str or os.PathLike
        Created when missing; the file is ``<directory>/<name>.safetensors``.
    seed : int
        The same seed gives the same bytes.

    Returns
    -------
    pathlib.Path
        The file written (``layout.nbytes`` bytes of tensor data plus the header).

    Raises
    ------
    CheckpointError
        An unknown layout name or a bad seed; any failure of
        :func:`etptr.save_safetensors`.
    """
    if isinstance(name, ModelLayout):
        layout = name
    elif isinstance(name, str) and name in LAYOUTS:
        layout = LAYOUTS[name]
    else:
        raise CheckpointError(f"name={name!r} is not a known layout (known: "
                              f"{', '.join(sorted(LAYOUTS))})")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CheckpointError(f"seed={seed!r} is not a non-negative int")
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"directory {str(folder)!r} cannot be created "
                              f"({exc.strerror or exc})") from None
    size = layout.element_size
    data: Any = _random_floats(layout.nbytes, size, seed)
    tensors: dict[str, TensorPtr] = {}
    offset = 0
    for tensor_name, shape in layout.shapes:
        n = size * int(np.prod(shape, dtype=np.int64))
        tensors[tensor_name] = make_tensor_ptr(list(shape), data[offset:offset + n],
                                               type=layout.scalar_type)
        offset += n
    path = folder / f"{layout.name}.safetensors"
    save_safetensors(tensors, path, metadata={"format": "pt", "etptr_layout": layout.name})
    return path
