#!/usr/bin/env bash
# hipscope serve beside llama-server on the same model file: 1, 4 and 16 concurrent streaming
# clients (scripts/serve-load.py), aggregate generated tokens/s and p50/p99 time to first token.
# Prints one JSON line per run and a Markdown table at the end.
#
#   scripts/serve-bench.sh HIPSCOPE_BIN LLAMA_SERVER MODEL.gguf [where]
#
# where: `cpu` (default; -t THREADS, both on the CPU) or `gpu` (hipscope --backend auto, llama-server
# -ngl 99). Environment: THREADS (default: all cores), PARALLEL (slots, default 16), CTX (total
# context, default PARALLEL*1024), MAX_TOKENS (default 64), REQUESTS (per client, default 3),
# CLIENTS (default "1 4 16"). Both servers get the same slots, context and batch; both are asked
# for exactly MAX_TOKENS tokens (ignore_eos), greedy.
set -euo pipefail

hs=${1:?hipscope binary}; ls_bin=${2:?llama-server binary}; model=${3:?model file}; where=${4:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
threads=${THREADS:-$(nproc)}
parallel=${PARALLEL:-16}
ctx=${CTX:-$((parallel * 1024))}
max_tokens=${MAX_TOKENS:-64}
requests=${REQUESTS:-3}
clients=${CLIENTS:-"1 4 16"}
base=$((20000 + RANDOM % 20000))
log=$(mktemp -d)
declare -A pid port
port[llama-server]=$base
port[hipscope]=$((base + 1))

stop_all() {
    for s in "${!pid[@]}"; do
        kill "${pid[$s]}" 2>/dev/null || true
    done
    for s in "${!pid[@]}"; do
        for _ in $(seq 100); do kill -0 "${pid[$s]}" 2>/dev/null || break; sleep 0.1; done
        kill -9 "${pid[$s]}" 2>/dev/null || true
    done
}
trap stop_all EXIT

wait_healthy() { # name
    for _ in $(seq 1200); do
        if curl -sf "http://127.0.0.1:${port[$1]}/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "${pid[$1]}" 2>/dev/null || { echo "$1 died; log:" >&2; tail -20 "$log/$1.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "$1 not healthy after 120 s" >&2; exit 1
}

start_server() { # name
    local p=${port[$1]}
    case "$1/$where" in
        hipscope/cpu) "$hs" serve --headless -m "$model" --backend cpu -t "$threads" --port "$p" \
            --parallel "$parallel" -c "$ctx" --max-queue 64 2>"$log/hipscope.log" & ;;
        hipscope/gpu) "$hs" serve --headless -m "$model" --port "$p" \
            --parallel "$parallel" -c "$ctx" --max-queue 64 2>"$log/hipscope.log" & ;;
        llama-server/cpu) "$ls_bin" -m "$model" --host 127.0.0.1 --port "$p" -t "$threads" \
            -np "$parallel" -c "$ctx" --metrics --no-warmup -ngl 0 >/dev/null 2>"$log/llama-server.log" & ;;
        llama-server/gpu) "$ls_bin" -m "$model" --host 127.0.0.1 --port "$p" \
            -np "$parallel" -c "$ctx" --metrics --no-warmup -ngl 99 >/dev/null 2>"$log/llama-server.log" & ;;
    esac
    pid[$1]=$!
}

# Both servers up at once (each idle while the other is measured), the runs alternating per
# client count, so that a machine shared with other work loads both alike.
for s in llama-server hipscope; do start_server "$s"; done
for s in llama-server hipscope; do
    wait_healthy "$s"
    # One warm-up request, not counted.
    python3 "$here/serve-load.py" --url "http://127.0.0.1:${port[$s]}" --clients 1 --requests 1 \
        --max-tokens 8 >/dev/null
done
results=()
for c in $clients; do
    for s in llama-server hipscope; do
        r=$(python3 "$here/serve-load.py" --url "http://127.0.0.1:${port[$s]}" --clients "$c" \
            --requests "$requests" --max-tokens "$max_tokens" --ignore-eos --label "$s")
        echo "$r"
        results+=("$r")
    done
done

echo
printf '%s\n' "${results[@]}" | python3 -c '
import json, sys
print("| server | clients | requests | tokens | aggregate t/s | TTFT p50 ms | TTFT p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
for line in sys.stdin:
    r = json.loads(line)
    keys = ("label", "clients", "requests", "tokens", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "errors")
    print("| " + " | ".join(str(r[k]) for k in keys) + " |")
'
echo
echo "slots $parallel, context $ctx, max_tokens $max_tokens, $requests requests per client, $where, threads $threads; load: $(cut -d' ' -f1-3 /proc/loadavg)"
