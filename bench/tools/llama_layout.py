"""Write a checkpoint with Llama-3-8B's tensor names and shapes (bf16, random finite
values, 16.06 GB) as Hugging Face lays it out: four shards under 5 GB and
``model.safetensors.index.json``, with etptr's own sharded save. It is the "16 GB layout"
of the save and load figures:

    PYTHONPATH=. python bench/tools/llama_layout.py OUTDIR [--seed N]
    etptr-bench OUTDIR/model.safetensors.index.json --dir /path/on/ext4 --tmpfs

Needs about 17 GB of free memory (the tensors are made in host memory) and 16.1 GB in
OUTDIR.
"""
import argparse
import sys
import time

import numpy as np

import etptr

HIDDEN, LAYERS, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 32, 14336, 32, 8, 128, 128256


def shapes():
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, HIDDEN)),
                (p + "self_attn.k_proj.weight", (kv, HIDDEN)),
                (p + "self_attn.v_proj.weight", (kv, HIDDEN)),
                (p + "self_attn.o_proj.weight", (HIDDEN, q)),
                (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
                (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
                (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
                (p + "input_layernorm.weight", (HIDDEN,)),
                (p + "post_attention_layernorm.weight", (HIDDEN,))]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    gen = np.random.SFC64(args.seed)
    tensors = {}
    total = 0
    t0 = time.perf_counter()
    for name, shape in shapes():
        n = int(np.prod(shape))
        raw = gen.random_raw((2 * n + 7) // 8).view(np.uint8)[:2 * n].copy()
        raw[1::2] &= 0xBF                 # bf16: clear the top exponent bit, |x| < 2
        tensors[name] = etptr.make_tensor_ptr(list(shape), raw, type=etptr.ScalarType.BFloat16)
        total += 2 * n
    etptr.save_safetensors(tensors, args.outdir, max_shard_size="5GB",
                           metadata={"format": "pt"})
    print(f"{len(tensors)} tensors, {total:,} bytes ({total / 1e9:.2f} GB) in {args.outdir} "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
