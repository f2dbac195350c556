#!/usr/bin/env bash
# Issue 33's table in one device call: every figure it names, hipscope `bench` beside llama.cpp's
# `llama-bench` on the same `hipscope synth` file, three repetitions each, the two engines
# alternating file by file. Runs on the device machine (CUDA or HIP; no Rust there): a prebuilt
# stripped hipscope at $HIPSCOPE_BIN (default ./hipscope-bin) and a llama-bench at $LLAMA_BENCH
# (built beforehand, e.g. by .device-carry/build-llama.sh: building it here would not leave time
# for the rest); python3.
#
# The files are written once into $WORK (default /tmp/i33), all in parallel at the start:
#   gemma3-1b Q4_0 and Q4_K, qwen3-0.6b Q4_0 and Q4_K, qwen3-30b-a3b Q4_0, gpt-oss-20b Q8_0
#   (MXFP4 experts as published), llama-3.2-1b Q4_K, llama-2-7b Q4_0, smollm2-135m Q4_0.
# Each row: `hipscope bench -m F ARGS -r 3 --json` and `llama-bench -m F ARGS -r 3 -ngl N -o json`
# (N = 99, or the row's -ngl for the split rows: half the layers on the CPU).
#
# Prints the table (markdown: model, test, llama.cpp, hipscope, ratio) and writes it with the raw
# JSON to $OUT (default /tmp): issue33-table.md, issue33-raw.jsonl. Exit 0 when every row ran;
# the ratios are what they are (the issue's aim is >= 1.0 on each).
# Usage: LLAMA_BENCH=/path/llama-bench scripts/device/issue33-table.sh
# Time: about 6-8 minutes on an H100 (the two MoE files take most of the writing).
. "$(dirname "$0")/env.sh"
REPS=${REPS:-3}
[ -x "$BIN" ] || { echo "issue33-table.sh: no hipscope binary at $BIN" >&2; exit 2; }
[ -n "$LB" ] && [ -x "$LB" ] || { echo "issue33-table.sh: set LLAMA_BENCH to a llama-bench binary" >&2; exit 2; }
mkdir -p "$WORK" "$OUT_DIR"
RAW=$OUT_DIR/issue33-raw.jsonl
: >"$RAW"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }

# name synth-shape quant
FILES="g1-q4_0 gemma3-1b Q4_0
g1-q4_k gemma3-1b Q4_K
q06-q4_0 qwen3-0.6b Q4_0
q06-q4_k qwen3-0.6b Q4_K
q30-q4_0 qwen3-30b-a3b Q4_0
oss-q8_0 gpt-oss-20b Q8_0
l1b-q4_k llama-3.2-1b Q4_K
l7b-q4_0 llama-2-7b Q4_0
smol-q4_0 smollm2-135m Q4_0"
while read -r name shape quant; do
    [ -s "$WORK/$name.gguf" ] || timeout 300 "$BIN" synth "$shape" --quant "$quant" -o "$WORK/$name.gguf" \
        >"$WORK/$name.synth.log" 2>&1 &
done <<<"$FILES"
wait
echo "files written $(el)"
# SYNTH_ONLY=1: only the files (issue33-call.sh writes them while the GPU runs the selftest).
[ "${SYNTH_ONLY:-}" = 1 ] && exit 0

# row FILE NGL ARGS...: both engines on one file, hipscope first.
row() {
    local f=$1 ngl=$2
    shift 2
    local hs ll
    hs=$(timeout 240 "$BIN" bench -m "$WORK/$f.gguf" -ngl "$ngl" "$@" -r "$REPS" --json 2>"$WORK/$f.hs.err")
    ll=$(timeout 240 "$LB" -m "$WORK/$f.gguf" -ngl "$ngl" "$@" -r "$REPS" -o json 2>"$WORK/$f.ll.err")
    python3 - "$f" "$ngl" "$hs" "$ll" >>"$RAW" <<'EOF'
import json, sys
f, ngl, hs, ll = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(s):
    try:
        return json.loads(s)
    except ValueError:
        return []
for engine, rows in (("hipscope", load(hs)), ("llama.cpp", load(ll))):
    for r in rows:
        print(json.dumps({"file": f, "ngl": ngl, "engine": engine, "n_prompt": r["n_prompt"],
                          "n_gen": r["n_gen"], "n_depth": r.get("n_depth", 0),
                          "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"],
                          "device": r.get("device") or r.get("gpu_info", "")}))
EOF
    echo "$f -ngl $ngl $* $(el)"
}

row g1-q4_0 99 -p 0 -n 128 -d 0,4096
row g1-q4_k 99 -p 0 -n 128
row q06-q4_0 99 -p 0 -n 128
row q06-q4_k 99 -p 0 -n 128
row q30-q4_0 99 -p 512 -n 128
row oss-q8_0 99 -p 512 -n 128
row l1b-q4_k 99 -p 2048,4096 -n 0
row l7b-q4_0 99 -p 2048,4096 -n 0
row smol-q4_0 99 -p 0 -n 128 -d 4096
# Half the layers on the CPU (qwen3-30b-a3b: 48 layers, gpt-oss-20b: 24).
row q30-q4_0 24 -p 512 -n 0
row oss-q8_0 12 -p 512 -n 0

python3 - "$RAW" "$OUT_DIR/issue33-table.md" <<'EOF'
import json, sys
from collections import OrderedDict
raw, md = sys.argv[1], sys.argv[2]
names = {"g1-q4_0": "gemma3-1b Q4_0", "g1-q4_k": "gemma3-1b Q4_K", "q06-q4_0": "qwen3-0.6b Q4_0",
         "q06-q4_k": "qwen3-0.6b Q4_K", "q30-q4_0": "qwen3-30b-a3b Q4_0",
         "oss-q8_0": "gpt-oss-20b (MXFP4 experts, Q8_0)", "l1b-q4_k": "llama-3.2-1b Q4_K",
         "l7b-q4_0": "llama-2-7b Q4_0", "smol-q4_0": "smollm2-135m Q4_0"}
rows = OrderedDict()
device = ""
for line in open(raw):
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    if r["n_depth"]:
        test += f" at depth {r['n_depth']}"
    model = names.get(r["file"], r["file"])
    if r["ngl"] != 99:
        model += f", -ngl {r['ngl']}"
    rows.setdefault((model, test), {})[r["engine"]] = (r["avg_ts"], r["stddev_ts"])
    if r["engine"] == "hipscope":
        device = r["device"]
out = [f"device: {device}", "", "| model (synth) | test | llama.cpp | hipscope | ratio |",
       "|---|---|---:|---:|---:|"]
below = 0
for (model, test), e in rows.items():
    fmt = lambda v: f"{v[0]:,.1f} ± {v[1]:,.1f}" if v else "—"
    ll, hs = e.get("llama.cpp"), e.get("hipscope")
    ratio = f"{hs[0] / ll[0]:.2f}" if ll and hs and ll[0] > 0 else "—"
    if ratio != "—" and float(ratio) < 1.0:
        below += 1
        ratio = f"**{ratio}**"
    out.append(f"| {model} | {test} | {fmt(ll)} | {fmt(hs)} | {ratio} |")
out.append("")
out.append(f"{len(rows)} figures, {below} below 1.0x llama.cpp (bold)")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
echo "done $(el)"
