"""Load benchmark for ``dllm serve``: N concurrent streaming clients vs offline batched ``generate``.

Three runs over the same prompts (task-suite prompts, chat template, greedy decoding):

* ``offline``: the prompts through ``model.generate`` in this process, ``--clients`` prompts per
  call (one batch per round: the best batching the server could reach at that concurrency);
* ``server xN``: a ``dllm serve`` subprocess, N clients (httpx + asyncio) each streaming its
  ``--rounds`` requests back to back;
* ``server x1``: the same server, one request at a time.

It reports completion tokens per second, p50/p95 latency, p50/p95 time to first token (first
streamed text), and the two ratios ``server xN / offline`` and ``server xN / server x1``. torch
uses ``--threads`` intra-op threads in both processes (``OMP_WAIT_POLICY=PASSIVE`` is set: spin-
waiting OpenMP threads collapse on a shared CPU box).

    python benchmarks/serve_load.py --model tiny-d2f --clients 8 --rounds 4 --max-tokens 64
    python benchmarks/serve_load.py --model random   # a random 5M-parameter model of the tiny shape
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

# torch is imported inside the functions, after OMP_WAIT_POLICY is set (main() sets it first)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUITES = ("arith", "gsm", "lists", "countdown", "sudoku")


def prompts_for(n: int) -> list[str]:
    from eval.tasks import get_suite

    per = -(-n // len(SUITES))
    pools = [get_suite(s).examples("test", per, seed=7) for s in SUITES]
    mixed = [ex.prompt for group in zip(*pools) for ex in group]
    return mixed[:n]


def build_random_model(directory: Path) -> Path:
    """A random model with the bundled tiny model's shape (d_model 256, 6 layers) and tokenizer."""
    from dllm.loading import BUNDLED_DIR
    from dllm.tokenization import load_tokenizer
    from serving.testing import build_checkpoint

    tok = load_tokenizer(BUNDLED_DIR / "tiny")
    return build_checkpoint(directory, d_model=256, n_layers=6, n_heads=8, mlp_hidden_size=768,
                            initializer_range=0.02, max_sequence_length=512, tokenizer=tok,
                            max_new_tokens=64, block_length=8)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def count_tokens(ids: list[int], eos: int | None, cap: int) -> tuple[int, list[int]]:
    """Completion tokens as the server counts them: text tokens capped at ``cap``, + 1 for an EOS that ended it."""
    if eos is not None and eos in ids:
        k = ids.index(eos)
        if k < cap:
            return k + 1, ids[:k]
    return min(len(ids), cap), ids[:cap]


# -- offline ----------------------------------------------------------------------------------------
class Offline:
    """The same prompts through ``model.generate`` in this process, ``batch`` prompts per call."""

    def __init__(self, path: Path, max_tokens: int, extra: dict) -> None:
        from dllm.loading import load_model
        from dllm.text import load_tokenizer_for

        self.model, self.tok = load_model(path), load_tokenizer_for(path)
        cfg = self.model.diffusion_generation_config
        cfg = cfg.replace(**extra) if extra else cfg
        block = cfg.block_length or max_tokens
        self.cfg = cfg.replace(max_new_tokens=-(-max_tokens // block) * block, return_dict_in_generate=True)
        self.max_tokens = max_tokens

    def _go(self, chunk: list[str]):
        from dllm.text import encode_prompts

        ids, mask = encode_prompts(self.tok, chunk, chat=True)
        t0 = time.perf_counter()
        out = self.model.generate(ids, attention_mask=mask, generation_config=self.cfg)
        return time.perf_counter() - t0, out, ids.shape[1]

    def run(self, prompts: list[str], batch: int) -> dict:
        seconds, forward_s, tokens, lat, texts, forwards = 0.0, 0.0, 0, [], [], []
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            dt, out, p = self._go(chunk)
            seconds += dt
            forward_s += out.timings.get("forward_seconds", 0.0)
            for r in range(len(chunk)):
                n, kept = count_tokens(out.sequences[r, p:].tolist(), self.tok.eos_token_id, self.max_tokens)
                tokens += n
                texts.append(self.tok.decode(kept, skip_special_tokens=True))
                forwards.append(int(out.num_forwards[r]))
                lat.append(dt)
        return {"mode": f"offline (batches of {batch})", "requests": len(prompts), "tokens": tokens,
                "seconds": seconds, "latencies": lat, "ttft": [], "texts": texts, "forwards": forwards,
                "forward_s": forward_s}


# -- server -----------------------------------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int, extra: dict) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    ttft, text, usage, dllm = None, [], None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                usage, dllm = chunk["usage"], chunk.get("dllm")
            for ch in chunk["choices"]:
                content = ch["delta"].get("content")
                if content:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(content)
    return {"latency": time.perf_counter() - t0, "ttft": ttft, "text": "".join(text),
            "tokens": usage["completion_tokens"], "forwards": dllm["num_forwards"] if dllm else 0}


async def drive(url: str, prompts: list[str], clients: int, max_tokens: int, extra: dict) -> tuple[list[dict], float]:
    results: list[dict | None] = [None] * len(prompts)
    queues = [list(range(c, len(prompts), clients)) for c in range(clients)]
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker(idx: list[int]) -> None:
            for i in idx:
                results[i] = await one_request(client, prompts[i], max_tokens, extra)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker(q) for q in queues])
        wall = time.perf_counter() - t0
    return results, wall


def start_server(path: Path, port: int, threads: int, max_batch: int, batch_wait_ms: float | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dllm.cli", "serve", "--model", str(path), "--port", str(port),
           "--num-threads", str(threads), "--max-batch-size", str(max_batch), "--served-model-name", "bench",
           "--log-level", "warning"] + ([] if batch_wait_ms is None else ["--batch-wait-ms", str(batch_wait_ms)])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError("the server exited:\n" + proc.stdout.read().decode())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not become ready in 120 s")
        time.sleep(0.2)


def server_row(name: str, results: list[dict], wall: float) -> dict:
    return {"mode": name, "requests": len(results), "tokens": sum(r["tokens"] for r in results), "seconds": wall,
            "latencies": [r["latency"] for r in results], "ttft": [r["ttft"] for r in results if r["ttft"] is not None],
            "texts": [r["text"] for r in results], "forwards": [r["forwards"] for r in results]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-d2f", help="tiny, tiny-d2f, a checkpoint directory, or 'random'")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (also the server's max batch size)")
    ap.add_argument("--rounds", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (server and offline)")
    ap.add_argument("--batch-wait-ms", type=float, default=None, help="the server's --batch-wait-ms (default: its own)")
    ap.add_argument("--extra", default="{}", help='diffusion options as JSON, e.g. \'{"threshold": 0.7}\'')
    ap.add_argument("--skip-sequential", action="store_true", help="skip the one-at-a-time server run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved repetitions of the three runs; the median one is shown (noisy machines)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    extra = json.loads(args.extra)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP; the server inherits it
    import torch

    torch.set_num_threads(args.threads)

    tmp = None
    if args.model == "random":
        tmp = tempfile.TemporaryDirectory(prefix="dllm-bench-")
        path = build_random_model(Path(tmp.name))
    else:
        from dllm.loading import resolve_model_path

        path = resolve_model_path(args.model)
    prompts = prompts_for(args.clients * args.rounds)

    offline = Offline(path, args.max_tokens, extra)
    offline.run(prompts[: args.clients], args.clients)  # warm-up
    port = free_port()
    proc = start_server(path, port, args.threads, args.clients, args.batch_wait_ms)
    url = f"http://127.0.0.1:{port}"
    reps: list[list[dict]] = []  # per repetition: offline, server xN, server x1 (interleaved: shared noise)
    try:
        asyncio.run(drive(url, prompts[: args.clients], args.clients, args.max_tokens, extra))  # warm-up
        for _ in range(args.repeat):
            rows = [offline.run(prompts, args.clients)]
            for clients in [args.clients] + ([] if args.skip_sequential else [1]):
                before = _batch_stats(httpx.get(url + "/metrics").text)
                res, wall = asyncio.run(drive(url, prompts, clients, args.max_tokens, extra))
                after = _batch_stats(httpx.get(url + "/metrics").text)
                row = server_row(f"server x{clients}", res, wall)
                calls = after[1] - before[1]
                row["rows_per_call"] = (after[0] - before[0]) / calls if calls else 0.0
                row["generate_s"], row["forward_s"] = after[2] - before[2], after[3] - before[3]
                rows.append(row)
            for r in rows:
                r["tok_s"] = r["tokens"] / r["seconds"]
            reps.append(rows)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if tmp is not None:
            tmp.cleanup()

    # the repetition with the median server xN / offline ratio is shown in full
    ratios = [rows[1]["tok_s"] / rows[0]["tok_s"] for rows in reps]
    rows = reps[sorted(range(len(reps)), key=lambda i: ratios[i])[len(reps) // 2]]
    print(f"model={args.model} prompts={len(prompts)} clients={args.clients} max_tokens={args.max_tokens} "
          f"threads={torch.get_num_threads()} strategy={offline.cfg.strategy} extra={extra} repeat={args.repeat}")
    head = f"{'mode':<24}{'req':>5}{'tokens':>8}{'wall s':>9}{'tok/s':>9}{'p50 lat':>9}{'p95 lat':>9}" \
           f"{'p50 ttft':>10}{'p95 ttft':>10}{'NFE/req':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['mode']:<24}{r['requests']:>5}{r['tokens']:>8}{r['seconds']:>9.2f}{r['tok_s']:>9.1f}"
              f"{pct(r['latencies'], .5):>9.3f}{pct(r['latencies'], .95):>9.3f}"
              f"{pct(r['ttft'], .5):>10.3f}{pct(r['ttft'], .95):>10.3f}{statistics.mean(r['forwards']):>9.1f}")
    same = sum(a == b for a, b in zip(rows[0]["texts"], rows[1]["texts"]))
    print(f"\nserver x{args.clients} / offline batched throughput: {ratios[reps.index(rows)]:.2f}"
          + (f"   (each repetition: {', '.join(f'{x:.2f}' for x in ratios)})" if len(reps) > 1 else ""))
    if len(rows) > 2:
        seq = [rs[1]["tok_s"] / rs[2]["tok_s"] for rs in reps]
        print(f"server x{args.clients} / server x1 (one at a time):   {rows[1]['tok_s'] / rows[2]['tok_s']:.2f}"
              + (f"   (each repetition: {', '.join(f'{x:.2f}' for x in seq)})" if len(reps) > 1 else ""))
    # Forward time drifts with the machine's load; the time outside forwards is the server's own cost.
    norm = (rows[0]["seconds"] / rows[0]["forward_s"]) / (rows[1]["seconds"] / rows[1]["forward_s"])
    print(f"server x{args.clients} / offline at equal forward speed:  {norm:.2f}   (wall / forward-time ratios; "
          "the same batches run the same forwards)")
    print(f"server texts identical to offline: {same}/{len(prompts)}")
    for r in rows[1:]:
        print(f"{r['mode']}: {r['rows_per_call']:.2f} rows per generate call; of {r['seconds']:.2f} s wall, "
              f"{r['generate_s']:.2f} s inside generate, {r['forward_s']:.2f} s in forwards "
              f"(offline: {rows[0]['seconds']:.2f} s generate, {rows[0]['forward_s']:.2f} s forwards)")
    if args.json:
        args.json.write_text(json.dumps([[{k: v for k, v in r.items() if k != "texts"} for r in rs] for rs in reps],
                                        indent=2))
    return 0


STAT_KEYS = ("dllm_batch_size_sum", "dllm_batch_size_count", "dllm_generate_seconds_sum", "dllm_forward_seconds_total")


def _batch_stats(metrics: str) -> tuple[float, ...]:
    """(rows, generate calls, seconds in generate, seconds in forwards) so far, from the server's metrics."""
    vals = {}
    for ln in metrics.splitlines():
        key, _, value = ln.partition(" ")
        if key in STAT_KEYS:
            vals[key] = float(value)
    return tuple(vals.get(k, 0.0) for k in STAT_KEYS)


if __name__ == "__main__":
    sys.exit(main())
