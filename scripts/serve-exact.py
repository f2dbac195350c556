#!/usr/bin/env python3
"""Whether a running server answers greedy requests the same alone and batched together.

  scripts/serve-exact.py --url http://127.0.0.1:8080 [--clients 4] [--max-tokens 32]

Sends each prompt alone (one after another), then all at once, greedy; prints one JSON line
with the prompts whose answers differ. Exit 0 when every answer is the same, 1 otherwise.
"""
import argparse
import concurrent.futures
import json
import sys
import urllib.request

PROMPTS = [
    "Name three colours.",
    "What is two plus two?",
    "Write one sentence about the moon.",
    "Say hello in French.",
    "List four animals that live in the sea.",
    "What is the capital of Italy?",
    "Describe rain in one sentence.",
    "Count from one to five.",
]


def ask(url, prompt, max_tokens):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    prompts = PROMPTS[: a.clients]
    alone = [ask(a.url, p, a.max_tokens) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        together = list(ex.map(lambda p: ask(a.url, p, a.max_tokens), prompts))
    differ = [p for p, x, y in zip(prompts, alone, together) if x != y]
    print(json.dumps({"clients": len(prompts), "same": len(prompts) - len(differ),
                      "differ": differ}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
