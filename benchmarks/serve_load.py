"""Load benchmark for ``dllm serve``: N concurrent streaming clients vs offline batched ``generate``.

Runs over the same prompts (task-suite prompts, chat template, greedy decoding, the model's
decoding config plus ``--extra``, the same ``--max-tokens``), interleaved ``--repeat`` times:

* ``offline``: the prompts through ``model.generate`` in this process, ``--clients`` prompts per
  call (one batch per round: the best batching the server could reach at that concurrency); only
  the time inside ``generate`` counts;
* ``server xN MODE``: one ``dllm serve`` subprocess per ``--modes`` entry (``join``: continuous
  batching with the server's default admission bound; ``join@N``: ``--join-max-spread N``, 0 = no
  bound; ``no-join``), N closed-loop clients each streaming its ``--rounds`` requests back to back;
* ``server x1``: the first mode's server, one request at a time.

It reports completion tokens per second, p50/p95 latency, p50/p95 time to first token (first
streamed text), the ratios ``server xN / offline`` and ``server xN / server x1`` (medians over the
repetitions, and each one), rows per ``generate`` call, joined rows, and where the time went
(inside ``generate``, in forwards, CPU seconds of the server and of the load generator). torch uses
``--threads`` intra-op threads in every process (``OMP_WAIT_POLICY=PASSIVE`` is set: spin-waiting
OpenMP threads collapse on a shared CPU box). The clients are a minimal asyncio HTTP client by
default (``--client httpx`` for httpx), so the load generator takes little CPU from the server.

    python benchmarks/serve_load.py --model tiny-d2f --clients 8 --rounds 6 --max-tokens 64 --repeat 3

``--mix`` gives requests different settings (request i uses set ``i % N``), as a server meets them:
offline then runs the same requests grouped by settings, each group in batches of ``--clients``.

    python benchmarks/serve_load.py --model tiny-d2f --mix '[{"strategy": "threshold", "threshold": 0.9},
        {"strategy": "threshold", "threshold": 0.7}, {"strategy": "d2f"}, {"strategy": "d2f", "skip_threshold": 0.7}]'
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

from dllm.eval.outputs import check_output_args

# torch is imported inside the functions, after OMP_WAIT_POLICY is set (main() sets it first)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUITES = ("arith", "gsm", "lists", "countdown", "sudoku")


def prompts_for(n: int) -> list[str]:
    from dllm.eval.tasks import get_suite

    per = -(-n // len(SUITES))
    pools = [get_suite(s).examples("test", per, seed=7) for s in SUITES]
    mixed = [ex.prompt for group in zip(*pools) for ex in group]
    return mixed[:n]


def build_random_model(directory: Path) -> Path:
    """A random model with the bundled tiny model's shape (d_model 256, 6 layers) and tokenizer."""
    from dllm.loading import BUNDLED_DIR
    from dllm.serving.testing import build_checkpoint
    from dllm.tokenization import load_tokenizer

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

    def run(self, prompts: list[str], batch: int, mix: list[dict] | None = None) -> dict:
        """``mix``: request i uses the settings ``mix[i % len(mix)]`` over the base ones; the prompts are
        grouped by settings, each group in batches of ``batch`` (what an offline user would do)."""
        mix = mix or [{}]
        base = self.cfg
        groups: dict[int, list[int]] = {}
        for i in range(len(prompts)):
            groups.setdefault(i % len(mix), []).append(i)
        seconds, forward_s, tokens, lat = 0.0, 0.0, 0, []
        texts, forwards = [""] * len(prompts), [0] * len(prompts)
        try:
            for k, idx in groups.items():
                self.cfg = base.replace(**mix[k]) if mix[k] else base
                for i in range(0, len(idx), batch):
                    chunk = idx[i:i + batch]
                    dt, out, p = self._go([prompts[j] for j in chunk])
                    seconds += dt
                    forward_s += out.timings.get("forward_seconds", 0.0)
                    for r, j in enumerate(chunk):
                        n, kept = count_tokens(out.sequences[r, p:].tolist(), self.tok.eos_token_id, self.max_tokens)
                        tokens += n
                        texts[j] = self.tok.decode(kept, skip_special_tokens=True)
                        forwards[j] = int(out.num_forwards[r])
                        lat.append(dt)
        finally:
            self.cfg = base
        grouped = " grouped by settings" if len(mix) > 1 else ""
        return {"mode": f"offline (batches of {batch}{grouped})", "requests": len(prompts), "tokens": tokens,
                "seconds": seconds, "latencies": lat, "ttft": [], "texts": texts, "forwards": forwards,
                "forward_s": forward_s}


# -- server -----------------------------------------------------------------------------------------
class RawClient:
    """A minimal HTTP/1.1 keep-alive client for the SSE stream (one connection, one request at a time).

    The load generator shares the CPUs with the server; httpx costs ~3 ms of CPU per
    streamed request, this about a tenth of it, so the measurement is mostly the server's.
    """

    def __init__(self, url: str) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def stream(self, path: str, body: dict):
        """POST ``body`` as JSON; yields the SSE ``data:`` payloads (strings) as they arrive."""
        import socket

        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" not in headers.get("transfer-encoding", ""):
            raw = await self.reader.readexactly(int(headers.get("content-length", 0)))
            raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
        buf = b""
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)  # + CRLF
            if size == 0:
                break
            buf += chunk[:-2]
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                for ln in ev.split(b"\n"):
                    if ln.startswith(b"data: "):
                        yield ln[6:].decode()
        if status != 200:
            raise RuntimeError(f"HTTP {status}")


async def one_request(client, prompt: str, max_tokens: int, extra: dict) -> dict:
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    ttft, text, usage, dllm = None, [], None, None
    if isinstance(client, RawClient):
        lines = client.stream("/v1/chat/completions", body)
    else:
        lines = _httpx_lines(client, body)
    async for line in lines:
        if line == "[DONE]":
            continue
        chunk = json.loads(line)
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


async def _httpx_lines(client: httpx.AsyncClient, body: dict):
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                yield line[6:]


async def drive(url: str, prompts: list[str], clients: int, max_tokens: int, extra: dict,
                kind: str = "raw", mix: list[dict] | None = None) -> tuple[list[dict], float]:
    """``clients`` closed-loop clients (each sends its next request when the last one is answered);
    request i adds the settings ``mix[i % len(mix)]``."""
    mix = mix or [{}]
    results: list[dict | None] = [None] * len(prompts)
    queues = [list(range(c, len(prompts), clients)) for c in range(clients)]
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as shared:
        async def worker(idx: list[int]) -> None:
            client = RawClient(url) if kind == "raw" else shared
            try:
                for i in idx:
                    results[i] = await one_request(client, prompts[i], max_tokens, {**extra, **mix[i % len(mix)]})
            finally:
                if kind == "raw":
                    await client.close()

        t0 = time.perf_counter()
        await asyncio.gather(*[worker(q) for q in queues])
        wall = time.perf_counter() - t0
    return results, wall


def start_server(path: Path, port: int, threads: int, max_batch: int, batch_wait_ms: float | None, join: bool = True,
                 stream_interval_ms: float | None = None, join_max_spread: float | None = None,
                 engine_process: bool = True) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dllm.cli", "serve", "--model", str(path), "--port", str(port),
           "--num-threads", str(threads), "--max-batch-size", str(max_batch), "--served-model-name", "bench",
           "--log-level", "warning", "--join" if join else "--no-join",
           "--engine-process" if engine_process else "--in-process"]
    cmd += [] if batch_wait_ms is None else ["--batch-wait-ms", str(batch_wait_ms)]
    cmd += [] if stream_interval_ms is None else ["--stream-interval-ms", str(stream_interval_ms)]
    cmd += [] if join_max_spread is None else ["--join-max-spread", str(join_max_spread)]
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


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process ``pid`` and its live children (the
    server's engine process) (Linux /proc; NaN elsewhere)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child))
        return total
    except (OSError, ValueError, IndexError):
        return float("nan")


def server_row(name: str, results: list[dict], wall: float) -> dict:
    return {"mode": name, "requests": len(results), "tokens": sum(r["tokens"] for r in results), "seconds": wall,
            "latencies": [r["latency"] for r in results], "ttft": [r["ttft"] for r in results if r["ttft"] is not None],
            "texts": [r["text"] for r in results], "forwards": [r["forwards"] for r in results]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MODES = {"join": True, "no-join": False}


def parse_mode(mode: str) -> tuple[bool, float | None, bool]:
    """``join`` (the server's default admission bound), ``join@N`` (--join-max-spread N; 0: none), ``no-join``;
    a ``:inproc`` suffix runs the server with ``--in-process`` (decoding thread in the HTTP process).

    Returns (join, join_max_spread, engine_process)."""
    base, _, suffix = mode.partition(":")
    if suffix not in ("", "inproc"):
        raise ValueError(mode)
    name, _, spread = base.partition("@")
    if name not in MODES or (spread and name != "join"):
        raise ValueError(mode)
    return MODES[name], float(spread) if spread else None, suffix != "inproc"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-d2f", help="tiny, tiny-d2f, a checkpoint directory, or 'random'")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (also the server's max batch size)")
    ap.add_argument("--rounds", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (server and offline)")
    ap.add_argument("--modes", default="join,no-join",
                    help="server scheduling modes to compare, comma-separated: join (continuous batching, "
                         "dllm serve --join), join@N (with --join-max-spread N; 0: unbounded), no-join (rows start "
                         "only between generate calls); append :inproc for an in-process engine (--in-process), "
                         "e.g. no-join:inproc")
    ap.add_argument("--batch-wait-ms", type=float, default=None, help="the server's --batch-wait-ms (default: its own)")
    ap.add_argument("--stream-interval-ms", type=float, default=None,
                    help="the server's --stream-interval-ms (default: its own)")
    ap.add_argument("--extra", default="{}", help='diffusion options as JSON, e.g. \'{"threshold": 0.7}\'')
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="load generator: a minimal asyncio HTTP/1.1 client (default; ~0.3 ms CPU per request) or "
                         "httpx (~3 ms: on a small shared machine it takes CPU from the server)")
    ap.add_argument("--skip-sequential", action="store_true", help="skip the one-at-a-time server run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved repetitions of all runs; medians are shown (noisy machines)")
    ap.add_argument("--mix", default="[]",
                    help='mixed settings: a JSON list of option sets, request i uses set i %% N over --extra, e.g. '
                         '\'[{"strategy": "threshold", "threshold": 0.9}, {"strategy": "d2f"}]\'; offline runs '
                         'the same requests grouped by settings')
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)
    extra = json.loads(args.extra)
    try:
        mix = json.loads(args.mix)
    except ValueError as err:
        ap.error(f"--mix: not JSON ({err})")
    if not isinstance(mix, list) or not all(isinstance(m, dict) for m in mix):
        ap.error("--mix: a JSON list of objects")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        parsed = {m: parse_mode(m) for m in modes}
    except ValueError as err:
        ap.error(f"--modes: {err} is not join, join@N (N blocks of --join-max-spread, 0: no bound) or no-join, "
                 "optionally with :inproc")
    if not modes:
        ap.error("--modes: give at least one")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP; the servers inherit it
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
    offline.run(prompts[: args.clients], args.clients, mix)  # warm-up
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    # runs per repetition: offline, then server xN in each mode, then server x1 (on the first mode's
    # server: one request at a time never joins anything). Interleaved, so they share the machine's noise.
    reps: list[dict[str, dict]] = []
    try:
        for mode in modes:
            port = free_port()
            proc = start_server(path, port, args.threads, args.clients, args.batch_wait_ms, join=parsed[mode][0],
                                stream_interval_ms=args.stream_interval_ms, join_max_spread=parsed[mode][1],
                                engine_process=parsed[mode][2])
            servers[mode] = (proc, f"http://127.0.0.1:{port}")
            asyncio.run(drive(servers[mode][1], prompts[: args.clients], args.clients, args.max_tokens, extra,
                              args.client, mix))  # warm-up
        for _ in range(args.repeat):
            c0 = cpu_seconds()
            rows = {"offline": offline.run(prompts, args.clients, mix)}
            rows["offline"]["client_cpu_s"] = cpu_seconds() - c0
            plan = [(f"server x{args.clients} {m}", m, args.clients) for m in modes]
            plan += [] if args.skip_sequential else [("server x1", modes[0], 1)]
            for name, mode, clients in plan:
                proc, url = servers[mode]
                before = _batch_stats(httpx.get(url + "/metrics").text)
                s0, c0 = cpu_seconds(proc.pid), cpu_seconds()
                res, wall = asyncio.run(drive(url, prompts, clients, args.max_tokens, extra, args.client, mix))
                s1, c1 = cpu_seconds(proc.pid), cpu_seconds()
                after = _batch_stats(httpx.get(url + "/metrics").text)
                row = server_row(name, res, wall)
                calls = after[1] - before[1]
                row["rows_per_call"] = (after[0] - before[0]) / calls if calls else 0.0
                row["generate_s"], row["forward_s"] = after[2] - before[2], after[3] - before[3]
                row["joined_rows"] = after[4] - before[4]
                row["server_cpu_s"], row["client_cpu_s"] = s1 - s0, c1 - c0
                rows[name] = row
            for r in rows.values():
                r["tok_s"] = r["tokens"] / r["seconds"]
            reps.append(rows)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        if tmp is not None:
            tmp.cleanup()

    names = list(reps[0])
    med = statistics.median
    print(f"model={args.model} prompts={len(prompts)} clients={args.clients} max_tokens={args.max_tokens} "
          f"threads={torch.get_num_threads()} strategy={offline.cfg.strategy} block_length={offline.cfg.block_length} "
          f"cache={offline.cfg.cache} extra={extra} mix={mix} repeat={args.repeat} (medians over repetitions)")
    head = f"{'mode':<24}{'req':>5}{'tokens':>8}{'wall s':>9}{'tok/s':>9}{'p50 lat':>9}{'p95 lat':>9}" \
           f"{'p50 ttft':>10}{'p95 ttft':>10}{'NFE/req':>9}{'rows/call':>10}"
    print(head)
    print("-" * len(head))
    for n in names:
        rs = [rows[n] for rows in reps]
        print(f"{n:<24}{rs[0]['requests']:>5}{rs[0]['tokens']:>8}{med(r['seconds'] for r in rs):>9.2f}"
              f"{med(r['tok_s'] for r in rs):>9.1f}{med(pct(r['latencies'], .5) for r in rs):>9.3f}"
              f"{med(pct(r['latencies'], .95) for r in rs):>9.3f}{med(pct(r['ttft'], .5) for r in rs):>10.3f}"
              f"{med(pct(r['ttft'], .95) for r in rs):>10.3f}{statistics.mean(rs[0]['forwards']):>9.1f}"
              + (f"{med(r['rows_per_call'] for r in rs):>10.2f}" if "rows_per_call" in rs[0] else f"{args.clients:>10}"))
    print()

    def ratio_line(label: str, num: str, den: str) -> None:
        xs = [rows[num]["tok_s"] / rows[den]["tok_s"] for rows in reps]
        each = f"   (each repetition: {', '.join(f'{x:.2f}' for x in xs)})" if len(xs) > 1 else ""
        print(f"{label:<48}{med(xs):.2f}{each}")

    for m in modes:
        name = f"server x{args.clients} {m}"
        ratio_line(f"{name} / offline batched:", name, "offline")
        if not args.skip_sequential:
            ratio_line(f"{name} / server x1 (one at a time):", name, "server x1")
    for m in modes:
        name = f"server x{args.clients} {m}"
        # Forward time drifts with the machine's load; dividing it out leaves the server's own cost.
        norm = [(rows["offline"]["seconds"] / rows["offline"]["forward_s"]) / (rows[name]["seconds"] / rows[name]["forward_s"])
                for rows in reps]
        same = sum(a == b for rows in reps for a, b in zip(rows["offline"]["texts"], rows[name]["texts"]))
        print(f"{name}: / offline at equal forward speed {med(norm):.2f}; texts identical to offline "
              f"{same}/{len(prompts) * len(reps)}")
    print("\nwhere the time goes (medians; CPU = user + system seconds of the server process / of this client process):")
    for n in names:
        rs = [rows[n] for rows in reps]
        if n == "offline":
            print(f"  {n:<22} wall {med(r['seconds'] for r in rs):.2f} s = time inside generate; "
                  f"{med(r['forward_s'] for r in rs):.2f} s in forwards")
            continue
        print(f"  {n:<22} wall {med(r['seconds'] for r in rs):.2f} s; inside generate {med(r['generate_s'] for r in rs):.2f} s,"
              f" forwards {med(r['forward_s'] for r in rs):.2f} s; {med(r['joined_rows'] for r in rs):.0f} rows joined a "
              f"running call; server CPU {med(r['server_cpu_s'] for r in rs):.2f} s, client CPU "
              f"{med(r['client_cpu_s'] for r in rs):.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "threads": torch.get_num_threads(),
                                         "repetitions": [{n: {k: v for k, v in r.items() if k != "texts"}
                                                          for n, r in rows.items()} for rows in reps]}, indent=2))
    return 0


STAT_KEYS = ("dllm_batch_size_sum", "dllm_batch_size_count", "dllm_generate_seconds_sum", "dllm_forward_seconds_total",
             "dllm_joined_rows_total")


def _batch_stats(metrics: str) -> tuple[float, ...]:
    """(rows, generate calls, seconds in generate, seconds in forwards, joined rows) so far, from the server's metrics."""
    vals = {}
    for ln in metrics.splitlines():
        key, _, value = ln.partition(" ")
        if key in STAT_KEYS:
            vals[key] = float(value)
    return tuple(vals.get(k, 0.0) for k in STAT_KEYS)


if __name__ == "__main__":
    sys.exit(main())
