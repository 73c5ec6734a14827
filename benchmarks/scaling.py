"""Memory and communication of large dLLMs on several GPUs, computed from their configs (no GPU needed).

    python benchmarks/scaling.py                                  # LLaDA-8B, SDAR-8B, LLaDA2.0-flash
    python benchmarks/scaling.py --config /models/X/config.json   # any LLaDA / Qwen-style / LLaDA2 config
    python benchmarks/scaling.py --json docs/results/scaling-2026-12-05.json

For each model and tensor-parallel degree N (1, 2, 4, 8) it prints: weights per GPU (bf16), KV cache per
token per GPU, what is left of an 80 GB GPU for the KV cache and how many tokens of context that holds,
and the bytes each GPU sends per decoding step: tensor parallelism all-reduces the hidden states twice
per layer (ring all-reduce: 2 (N - 1) / N x the tensor, per GPU), plus the compact vocabulary-parallel
head exchange (each rank's argmax and confidence per scored position, not the logits). For LoPA's branch
parallelism it prints the bytes one round moves: the canvas of every branch out, compact results back
(per window slot a token and a probability, a score, a K/V digest). Mixture-of-experts models are also
shown with expert parallelism (experts spread over the GPUs, attention replicated): the all-to-all moves
each token's hidden state to its top-k experts' GPUs and back.

The formulas are what dllm's layouts move; they are not measurements (docs/scaling.md says so).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

BF16 = 2
GPU_BYTES = 80e9
RUNTIME_RESERVE = 0.1  # of a GPU kept for activations, workspaces and the allocator

# Published configs (config.json fields as the checkpoints ship them; LLaDA2.0-flash from inclusionAI/dFactory
# configs/model_configs/llada2_flash/config.json; SDAR-8B is Qwen3-8B-shaped)
MODELS = {
    "LLaDA-8B": {"architectures": ["LLaDAModelLM"], "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32,
                 "mlp_hidden_size": 12288, "vocab_size": 126464, "weight_tying": False},
    "SDAR-8B": {"architectures": ["SDARForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                "vocab_size": 151936, "tie_word_embeddings": False},
    "LLaDA2.0-flash": {"architectures": ["LLaDA2MoeModelLM"], "hidden_size": 4096, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 9216,
                       "moe_intermediate_size": 1024, "num_experts": 256, "num_experts_per_tok": 8,
                       "num_shared_experts": 1, "first_k_dense_replace": 1, "vocab_size": 157184,
                       "tie_word_embeddings": False},
}


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP hidden size
    vocab: int
    tied: bool
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # MoE models: leading dense layers

    @classmethod
    def from_config(cls, name: str, c: dict) -> Shape:
        if "d_model" in c:  # LLaDA field names
            hidden, heads = c["d_model"], c["n_heads"]
            return cls(name, hidden, c["n_layers"], heads, c.get("n_kv_heads") or heads, hidden // heads,
                       c.get("mlp_hidden_size") or 4 * hidden, c.get("embedding_size") or c["vocab_size"],
                       bool(c.get("weight_tying")))
        hidden, heads = c["hidden_size"], c["num_attention_heads"]
        experts = c.get("num_experts") or 0
        return cls(name, hidden, c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                   c.get("head_dim") or hidden // heads, c["intermediate_size"], c["vocab_size"],
                   bool(c.get("tie_word_embeddings")), experts, c.get("num_experts_per_tok") or 0,
                   c.get("moe_intermediate_size") or 0, c.get("num_shared_experts") or 0,
                   c.get("first_k_dense_replace") or 0 if experts else 0)

    # -- parameters ---------------------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def ffn_params(self) -> tuple[int, int]:
        """(all FFN weights, the ones one token uses)."""
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.ffn
        per_expert = 3 * self.hidden * self.expert_ffn
        routed = self.moe_layers * self.experts * per_expert
        shared = self.moe_layers * self.shared_experts * per_expert
        router = self.moe_layers * self.hidden * self.experts
        active = dense + shared + router + self.moe_layers * self.experts_per_token * per_expert
        return dense + routed + shared + router, active

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> tuple[int, int]:
        ffn, ffn_active = self.ffn_params()
        norms = (2 * self.layers + 1) * self.hidden
        common = self.layers * self.attention_params + self.embedding_params + norms
        return common + ffn, common + ffn_active

    # -- per GPU -------------------------------------------------------------------------------------
    def weights_per_gpu(self, n: int, expert_parallel: bool = False) -> float:
        """Bytes of bf16 weights on one of ``n`` GPUs: column/row-parallel projections and a vocabulary-
        parallel embedding and head split n ways (KV projections replicate when kv_heads < n); norms
        replicate. With ``expert_parallel`` the routed experts are spread over the GPUs and everything
        else is replicated."""
        total, _ = self.params()
        ffn, _ = self.ffn_params()
        routed = self.moe_layers * self.experts * 3 * self.hidden * self.expert_ffn
        if expert_parallel:
            return BF16 * (total - routed + routed / n)
        kv_split = n if self.kv_heads >= n else self.kv_heads  # a KV head is never split below one per GPU
        attn = self.layers * self.hidden * self.head_dim * (2 * self.heads / n + 2 * self.kv_heads / kv_split)
        norms = (2 * self.layers + 1) * self.hidden
        return BF16 * (attn + ffn / n + self.embedding_params / n + norms)

    def kv_bytes_per_token(self, n: int = 1) -> float:
        kv_heads = max(1, self.kv_heads / n) if self.kv_heads >= n else 1  # replicated below one head per GPU
        return 2 * self.layers * kv_heads * self.head_dim * BF16

    # -- traffic per decoding step ---------------------------------------------------------------------
    def tp_bytes_per_step(self, n: int, tokens: int, scored: int) -> float:
        """Bytes one GPU sends per forward under tensor parallelism: two ring all-reduces of the hidden
        states per layer, plus the head's compact exchange (argmax + confidence per scored position)."""
        if n == 1:
            return 0.0
        allreduce = 2 * (n - 1) / n * tokens * self.hidden * BF16
        head = (n - 1) * scored * 2 * 4  # int32 token + fp32 confidence, gathered from every other rank
        return 2 * self.layers * allreduce + head

    def ep_bytes_per_step(self, n: int, tokens: int) -> float:
        """Bytes one GPU sends per forward under expert parallelism: each token's hidden state to the GPUs
        of its top-k experts and back (all-to-all), on average (n - 1) / n of them remote."""
        if n == 1 or not self.experts:
            return 0.0
        return self.moe_layers * 2 * tokens / n * self.experts_per_token * (n - 1) / n * self.hidden * BF16


def lopa_round_bytes(branches: int, window: int, layers: int, rows: int = 1) -> dict:
    """Bytes of one LoPA round under branch parallelism (``branches`` lookahead + the anchor over ranks):
    rank 0 sends each branch's window of token ids, each rank returns per window slot a token and a
    probability (fp64 on the wire), a branch score and a 4-number-per-layer K/V digest of the winner's
    commit check."""
    slots = rows * (branches + 1)
    out = slots * window * 8
    back = slots * (2 * window + 1 + 4 * layers) * 8
    return {"sent_by_rank0": out, "returned": back}


def report(shape: Shape, tp_degrees=(1, 2, 4, 8), rows: int = 8, window: int = 32) -> dict:
    total, active = shape.params()
    out = {"model": shape.name, "shape": asdict(shape), "params": total, "active_params": active,
           "kv_bytes_per_token": shape.kv_bytes_per_token(), "layouts": []}
    for n in tp_degrees:
        for ep in ([False, True] if shape.experts and n > 1 else [False]):
            w = shape.weights_per_gpu(n, expert_parallel=ep)
            kv = shape.kv_bytes_per_token(1 if ep else n)
            room = GPU_BYTES * (1 - RUNTIME_RESERVE) - w
            out["layouts"].append({
                "layout": f"{'EP' if ep else 'TP'} {n}", "gpus": n, "weights_per_gpu": w, "kv_bytes_per_token_per_gpu": kv,
                "kv_room_per_gpu": max(room, 0.0), "context_tokens_per_gpu": max(room, 0.0) / kv,
                "fits": room > 0,
                "bytes_per_step_per_gpu": (shape.ep_bytes_per_step(n, rows * window) if ep
                                           else shape.tp_bytes_per_step(n, rows * window, rows * window)),
            })
    out["lopa_round"] = {k: lopa_round_bytes(k, window, shape.layers) for k in (2, 4, 8)}
    return out


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def markdown(r: dict, rows: int, window: int) -> str:
    lines = [f"#### {r['model']}: {r['params'] / 1e9:.2f}B parameters"
             + (f" ({r['active_params'] / 1e9:.2f}B active per token)" if r["active_params"] != r["params"] else "")
             + f", KV cache {r['kv_bytes_per_token'] / 1e6:.3f} MB per token (bf16)", "",
             f"| layout | weights per GPU | KV per token per GPU | context tokens in the rest of 80 GB | sent per GPU per step ({rows} rows x {window} slots) |",
             "|---|---|---|---|---|"]
    for lay in r["layouts"]:
        ctx = f"{lay['context_tokens_per_gpu']:,.0f}" if lay["fits"] else "does not fit"
        lines.append(f"| {lay['layout']} | {_gb(lay['weights_per_gpu'])} | {lay['kv_bytes_per_token_per_gpu'] / 1e6:.3f} MB "
                     f"| {ctx} | {lay['bytes_per_step_per_gpu'] / 1e6:.1f} MB |")
    lo = r["lopa_round"]
    lines += ["", "LoPA branch parallelism, one round (one row, window of " f"{window}): "
              + "; ".join(f"k={k}: {v['sent_by_rank0'] / 1e3:.1f} kB out, {v['returned'] / 1e3:.1f} kB back"
                          for k, v in lo.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="a config.json (repeatable); default: the three above")
    ap.add_argument("--rows", type=int, default=8, help="rows decoded together (the batch)")
    ap.add_argument("--window", type=int, default=32, help="slots one forward feeds per row (a block)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    configs = {Path(p).parent.name or p: json.loads(Path(p).read_text()) for p in args.config} or MODELS
    reports = [report(Shape.from_config(name, c), rows=args.rows, window=args.window) for name, c in configs.items()]
    for r in reports:
        print(markdown(r, args.rows, args.window) + "\n")
    result = {"rows": args.rows, "window": args.window, "gpu_bytes": GPU_BYTES, "runtime_reserve": RUNTIME_RESERVE,
              "models": reports}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
