"""Smoke request + rough decode throughput against a running SGLang server (stdlib only).

    python bench/sglang_cpu/smoke_bench.py [BASE_URL] [--tokens N] [--concurrency 1,4]

Sends /v1/completions with `ignore_eos` (an SGLang extension) so every request produces
exactly N tokens even with dummy weights, and reports completion tokens / wall time:
per-request and aggregate tokens/s.  Numbers are end-to-end (prefill + decode + HTTP).
"""

import argparse
import json
import threading
import time
import urllib.request


def complete(base, prompt, max_tokens, extra=None):
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    body.update(extra or {})
    req = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(base, n_conc, tokens):
    results = [None] * n_conc

    def one(i):
        t0 = time.perf_counter()
        out = complete(base, f"Request {i}: once upon a time", tokens, {"ignore_eos": True})
        results[i] = (time.perf_counter() - t0, out["usage"]["completion_tokens"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_conc)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(r[1] for r in results)
    per_req = [r[1] / r[0] for r in results]
    return {
        "concurrency": n_conc,
        "tokens_per_request": tokens,
        "wall_s": round(wall, 3),
        "completion_tokens": total,
        "aggregate_tok_s": round(total / wall, 1),
        "per_request_tok_s": [round(x, 1) for x in per_req],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default="http://127.0.0.1:30000")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4")
    a = ap.parse_args()
    smoke = complete(a.base, "Hello, my name is", 16)
    print("smoke:", json.dumps(smoke))
    assert smoke["choices"][0]["text"], "empty completion text"
    complete(a.base, "warm up", 8, {"ignore_eos": True})
    for c in [int(x) for x in a.concurrency.split(",")]:
        print(json.dumps(run(a.base, c, a.tokens)))


if __name__ == "__main__":
    main()
