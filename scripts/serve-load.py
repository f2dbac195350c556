#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (hipscope serve, llama-server, ...).

C concurrent clients each send R streaming chat requests one after another (stdlib only: plain
HTTP, the SSE read by hand), then print one JSON line: requests, errors, aggregate generated
tokens per second over the run's wall time, and time to first token (p50, p99, max).

  scripts/serve-load.py --url http://127.0.0.1:8080 --clients 4 --requests 4 --max-tokens 64

Token counts come from the server's `usage` (stream_options.include_usage), else from the
number of content chunks. `--ignore-eos` asks both servers to generate exactly --max-tokens.
Bounded: every request has a timeout, the run stops by itself.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright, step by step.",
    "List ten uses for a paperclip and say why each works.",
    "Describe the water cycle to a ten-year-old.",
    "Write a letter from a cat to its owner about breakfast.",
    "What are the main differences between a violin and a cello?",
    "Give a recipe for pancakes and explain each step.",
    "Tell me about the history of the printing press.",
    "Write a poem about autumn leaves in a city park.",
    "How do bees make honey? Explain in detail.",
    "Describe a day in the life of a deep-sea diver.",
    "What should someone pack for a week of hiking in the mountains?",
    "Explain what a compiler does, for a beginner.",
    "Write a dialogue between a robot and a gardener.",
    "Why is the sky blue? Give a careful explanation.",
    "Describe the rules of chess to someone who has never played.",
]


def one(url, key, model, prompt, max_tokens, ignore_eos, timeout):
    u = urllib.parse.urlparse(url)
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    r = c.getresponse()
    if r.status != 200:
        msg = r.read()[:200]
        c.close()
        return {"error": f"HTTP {r.status}: {msg!r}"}
    ttft = None
    chunks = 0
    usage = None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            c.close()
            return {"error": str(ev["error"])}
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("content") or d.get("reasoning_content"):
                chunks += 1
                if ttft is None:
                    ttft = time.monotonic() - t0
    c.close()
    tokens = usage["completion_tokens"] if usage else chunks
    return {"ttft": ttft if ttft is not None else time.monotonic() - t0,
            "tokens": tokens, "end": time.monotonic()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--key-file")
    ap.add_argument("--model")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    key = open(a.key_file).readline().strip() if a.key_file else None
    results, lock = [], threading.Lock()

    def client(i):
        for j in range(a.requests):
            p = PROMPTS[(i * a.requests + j) % len(PROMPTS)]
            try:
                res = one(a.url, key, a.model, p, a.max_tokens, a.ignore_eos, a.timeout)
            except Exception as e:  # a broken connection is a result too
                res = {"error": repr(e)}
            with lock:
                results.append(res)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ok = [r for r in results if "error" not in r]
    errs = [r["error"] for r in results if "error" in r]
    ttfts = sorted(r["ttft"] for r in ok)

    def pct(p):
        if not ttfts:
            return None
        return ttfts[min(len(ttfts) - 1, int(round(p / 100 * (len(ttfts) - 1))))]

    tokens = sum(r["tokens"] for r in ok)
    out = {
        "label": a.label, "clients": a.clients, "requests": len(results), "errors": len(errs),
        "tokens": tokens, "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "ttft_p50_ms": round(pct(50) * 1e3) if ttfts else None,
        "ttft_p99_ms": round(pct(99) * 1e3) if ttfts else None,
        "ttft_max_ms": round(ttfts[-1] * 1e3) if ttfts else None,
        "ttft_mean_ms": round(statistics.mean(ttfts) * 1e3) if ttfts else None,
    }
    if errs:
        out["first_error"] = errs[0]
    print(json.dumps(out))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
