"""Rollouts for RL: prompts from the task suites, G samples per prompt through our decoding engine
(with step maps), verifier scores and TPF. In-process: the policy that generates is the one being
trained (no file hand-offs).

TPF of a rollout = L / F (LightningRL §1.2 and our engine's ``tpf``): L = tokens up to and including
the first EOS (G if none), F = forwards the row took until it stopped. With ``exact_canvas`` the
decoder runs with ``stop_at_eos=False`` so that tokens committed *after* the first EOS (which were
on the canvas while earlier tokens were decoded) are kept verbatim for the trajectory replay;
rows then decode past their stop point, and F is recovered as the step that completed the prefix
up to the first EOS, ``max(step_map[:L])`` (the forward at which ``stop_at_eos=True`` retires the
row; commits never change, so the trajectory up to that forward is the same).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch

from dllm.decoding.stopping import EosIds
from dllm.text import completion_text, left_pad

from .encoding import encode_answer, encode_messages, encode_prompt
from .files import DataFileError, EpochOrder

# --------------------------------------------------------------------------------------------
# prompts


class RecordPrompts:
    """The prompts of a data file or a ``train_dataset`` as suite-like examples, in a seeded per-epoch
    order shared by every rank (rank ``r`` of ``w`` reads positions ``r, r + w, ...``).

    Dropped, and counted in ``summary()``: prompts longer than ``max_prompt_tokens`` (no room left for
    the canvas) and, with ``answers_must_fit`` (exact-match scoring), examples whose reference answer
    plus EOS is longer than the canvas (``max_new_tokens``): no rollout could ever match it.
    """

    def __init__(self, records: list, label: str, tokenizer, max_new_tokens: int, seed: int, rank: int = 0,
                 world_size: int = 1, max_prompt_tokens: int | None = None, answers_must_fit: bool = True,
                 where: str | None = None) -> None:
        from dllm.eval.tasks import Example

        self.label, self.where = label, where or label
        self.read, self.too_long_prompt, self.too_long_answer = len(records), 0, 0
        self.examples = []
        for i, r in enumerate(records):
            msgs = r.prompt_messages()
            if max_prompt_tokens is not None and len(encode_messages(tokenizer, msgs)) > max_prompt_tokens:
                self.too_long_prompt += 1
                continue
            if answers_must_fit and len(encode_answer(tokenizer, r.answer)) > max_new_tokens:
                self.too_long_answer += 1
                continue
            prompt = next((c for role, c in reversed(r.messages) if role == "user"), r.messages[-1][1])
            self.examples.append(Example(f"{label}-{i:05d}", label, prompt, r.answer,
                                         {"key": f"{label}:{i}", "messages": msgs, "extra": dict(r.extra)}))
        if not self.examples:
            raise DataFileError(f"{self.where}: none of its {self.read} examples fits ({self.summary()}); raise "
                                "data.max_new_tokens or shorten the examples")
        self.order = EpochOrder(len(self.examples), seed, label, rank, world_size)

    def summary(self) -> str:
        parts = [f"{len(self.examples):,} of {self.read:,} prompts used"]
        if self.too_long_prompt:
            parts.append(f"{self.too_long_prompt:,} dropped: prompt longer than the model's context minus the canvas")
        if self.too_long_answer:
            parts.append(f"{self.too_long_answer:,} dropped: reference answer + EOS longer than data.max_new_tokens "
                         "(exact match could never score it)")
        return "; ".join(parts)

    def example(self, cursor: int):
        return self.examples[self.order.index(cursor)]


class PromptStream:
    """Infinite, deterministic, resumable train prompts over a weighted mix of suites and record sources
    (``RecordPrompts``: data files, a train_dataset).

    Round ``k`` of process ``rank`` picks its sources from ``Random((seed, rank, k))``; suite examples
    come from per-suite cursors into deterministic chunks (``suite.examples("train", chunk_size,
    seed=chunk_seed)``), record examples from per-source cursors into their epoch order, so the
    position is (rounds drawn, cursors).
    """

    def __init__(self, tasks: dict, seed: int, rank: int = 0, chunk_size: int = 2048, mix: str = "per_example",
                 sources: dict | None = None, source_weights: dict | None = None) -> None:
        from dllm.eval.tasks import get_suite

        weights = {k: float(v) for k, v in tasks.items() if float(v) > 0}
        self.sources = dict(sources or {})
        weights.update({k: float((source_weights or {}).get(k, 1.0)) for k in self.sources})
        if not any(w > 0 for w in weights.values()):
            raise ValueError("no prompt source with a positive weight")
        self.suites = {n: get_suite(n) for n in weights if n not in self.sources}
        self.names = list(weights)
        self.weights = [weights[n] for n in self.names]
        self.seed, self.rank, self.chunk_size, self.mix = seed, rank, chunk_size, mix
        self.rounds = 0
        self.cursors = {n: 0 for n in self.names}
        self._chunks: dict = {}

    def state_dict(self) -> dict:
        return {"rounds": self.rounds, "cursors": dict(self.cursors)}

    def load_state_dict(self, state: dict) -> None:
        self.rounds = int(state["rounds"])
        self.cursors = {n: int(state["cursors"].get(n, 0)) for n in self.names}

    def _chunk(self, name: str, k: int):
        if (name, k) not in self._chunks:
            if len(self._chunks) > 2 * len(self.names):
                self._chunks.clear()
            chunk_seed = ((self.seed * 1_000_003 + self.rank) * 1_000_003 + k) + 7
            self._chunks[(name, k)] = self.suites[name].examples("train", self.chunk_size, seed=chunk_seed)
        return self._chunks[(name, k)]

    def _take(self, name: str):
        c = self.cursors[name]
        self.cursors[name] = c + 1
        if name in self.sources:
            return self.sources[name].example(c)
        return self._chunk(name, c // self.chunk_size)[c % self.chunk_size]

    def next(self, n: int) -> list:
        """The next ``n`` examples (``dllm.eval.tasks.Example``)."""
        rng = random.Random(f"grpo:{self.seed}:{self.rank}:{self.rounds}")
        self.rounds += 1
        if self.mix == "per_batch":
            names = [rng.choices(self.names, self.weights)[0]] * n
        else:
            names = rng.choices(self.names, self.weights, k=n)
        return [self._take(name) for name in names]


# --------------------------------------------------------------------------------------------
# rollouts


@dataclass
class Rollouts:
    """n = groups x group_size rollouts; rows of a group are contiguous."""

    prompt_ids: torch.Tensor  # [n, P] left-padded
    prompt_mask: torch.Tensor  # [n, P] 1 on real prompt tokens
    gen_ids: torch.Tensor  # [n, G] the committed tokens (post-EOS tokens kept with exact_canvas)
    step_map: torch.Tensor  # [n, G] 1-based forward that committed each slot, -1 never
    lengths: torch.Tensor  # [n] tokens up to and including the first EOS (G if none)
    forwards: torch.Tensor  # [n] forwards until the row stopped
    tpf: torch.Tensor  # [n] float64 lengths / forwards
    correct: torch.Tensor  # [n] bool, the verifier's strict verdict
    score: torch.Tensor  # [n] float64 verifier reward in [0, 1] (graded where the suite grades)
    group: torch.Tensor  # [n] group index
    group_size: int
    suites: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reason: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.gen_ids.shape[0])

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.num_groups, self.group_size, *x.shape[1:])

    def select_groups(self, keep: torch.Tensor) -> Rollouts:
        """The rollouts of the groups flagged in ``keep`` [groups] (renumbered 0..k-1)."""
        rows = keep.bool().repeat_interleave(self.group_size)
        idx = torch.nonzero(rows).flatten()
        il = idx.tolist()
        new_group = torch.arange(int(keep.sum())).repeat_interleave(self.group_size)
        return Rollouts(self.prompt_ids[idx], self.prompt_mask[idx], self.gen_ids[idx], self.step_map[idx],
                        self.lengths[idx], self.forwards[idx], self.tpf[idx], self.correct[idx], self.score[idx],
                        new_group.to(self.group.device), self.group_size, [self.suites[i] for i in il],
                        [self.texts[i] for i in il], [self.finish_reason[i] for i in il])

    def rows(self, idx: torch.Tensor) -> Rollouts:
        """A row subset (for minibatches; group structure is not kept)."""
        il = idx.tolist()
        return replace(self, prompt_ids=self.prompt_ids[idx], prompt_mask=self.prompt_mask[idx],
                       gen_ids=self.gen_ids[idx], step_map=self.step_map[idx], lengths=self.lengths[idx],
                       forwards=self.forwards[idx], tpf=self.tpf[idx], correct=self.correct[idx],
                       score=self.score[idx], group=self.group[idx], suites=[self.suites[i] for i in il],
                       texts=[self.texts[i] for i in il], finish_reason=[self.finish_reason[i] for i in il])

    @staticmethod
    def cat(parts: list[Rollouts], pad_id: int) -> Rollouts:
        """Concatenate (re-left-padding prompts to the longest); group ids are renumbered."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("nothing to concatenate")
        p_len = max(p.prompt_ids.shape[1] for p in parts)

        def pad(t: torch.Tensor, value: int) -> torch.Tensor:
            extra = p_len - t.shape[1]
            return torch.cat([torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device), t], 1) if extra else t

        offset, groups = 0, []
        for p in parts:
            groups.append(p.group + offset)
            offset += p.num_groups
        return Rollouts(
            torch.cat([pad(p.prompt_ids, pad_id) for p in parts]), torch.cat([pad(p.prompt_mask, 0) for p in parts]),
            torch.cat([p.gen_ids for p in parts]), torch.cat([p.step_map for p in parts]),
            torch.cat([p.lengths for p in parts]), torch.cat([p.forwards for p in parts]),
            torch.cat([p.tpf for p in parts]), torch.cat([p.correct for p in parts]),
            torch.cat([p.score for p in parts]), torch.cat(groups), parts[0].group_size,
            [x for p in parts for x in p.suites], [x for p in parts for x in p.texts],
            [x for p in parts for x in p.finish_reason],
        )


def _eos_ids(eos_id) -> EosIds:
    return EosIds(() if eos_id is None else (eos_id,) if isinstance(eos_id, int) else eos_id)


def stop_point(gen_ids: torch.Tensor, step_map: torch.Tensor, num_forwards: torch.Tensor,
               eos_id) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths L, forwards F) of each row: L up to and including the first EOS (any of ``eos_id``: one
    id, several, or None; G if none); F the forward that completed slots [0, L) when there is an EOS,
    else the row's forward count."""
    n, g = gen_ids.shape
    eos = _eos_ids(eos_id)
    if not eos:
        return torch.full((n,), g, dtype=torch.long), num_forwards.long().clone()
    is_eos = eos.match(gen_ids)
    has = is_eos.any(-1)
    lengths = torch.where(has, is_eos.long().argmax(-1) + 1, torch.full((n,), g, dtype=torch.long))
    inside = torch.arange(g)[None, :] < lengths[:, None]
    done_at = torch.where(inside, step_map, torch.zeros_like(step_map)).max(-1).values
    forwards = torch.where(has, done_at, num_forwards.long())
    return lengths, forwards.clamp(min=1)


@torch.no_grad()
def generate_rollouts(
    model,
    tokenizer,
    examples: list,
    group_size: int,
    gen_cfg,
    *,
    batch_size: int = 64,
    seed: int = 0,
    truncated_is_wrong: bool = True,
    scorer=None,
    first_chunk: int = 0,
) -> Rollouts:
    """``group_size`` samples of each example through ``model.generate`` (``gen_cfg``: a
    DiffusionGenerationConfig; its ``seed`` is replaced per generate call from ``seed``), scored by
    ``scorer`` (``dllm.training.rewards.Scorer``; default: the suites' verifiers and exact match).
    ``first_chunk``: the index of the first ``batch_size`` chunk of rows within a larger batch (the chunk's
    seed depends on it): a process generating its share of a global batch gets the rows one process would."""
    from .rewards import Scorer

    scorer = scorer if scorer is not None else Scorer()
    was_training = model.training
    model.eval()
    eos_id = gen_cfg.eos_token_ids or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    eos = _eos_ids(eos_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos.first
    encoded = [encode_messages(tokenizer, ex.meta["messages"]) if "messages" in ex.meta
               else encode_prompt(tokenizer, ex.prompt) for ex in examples]
    rows = [(i, encoded[i]) for i in range(len(examples)) for _ in range(group_size)]
    device = model.get_input_embeddings().weight.device
    prompts, gens, maps, nfes, reasons = [], [], [], [], []
    try:
        for c, start in enumerate(range(0, len(rows), batch_size)):
            chunk = rows[start : start + batch_size]
            ids, mask = left_pad([q for _, q in chunk], pad_id)
            cfg = gen_cfg.replace(seed=(int(seed) * 1009 + first_chunk + c) % (2**62), return_dict_in_generate=True)
            out = model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=cfg,
                                 tokenizer=tokenizer)
            p = ids.shape[1]
            prompts += [q for _, q in chunk]
            gens.append(out.sequences[:, p:].cpu())
            maps.append(out.step_map.cpu())
            nfes.append(out.num_forwards.cpu())
            reasons += list(out.finish_reason)
    finally:
        model.train(was_training)
    gen_ids, step_map, nfe = torch.cat(gens), torch.cat(maps), torch.cat(nfes)
    lengths, forwards = stop_point(gen_ids, step_map, nfe, eos_id)
    tpf = lengths.double() / forwards.double()
    has_eos = eos.match(gen_ids).any(-1) if eos else torch.ones(len(rows), dtype=torch.bool)
    row_examples = [examples[i] for i, _ in rows]
    texts = [completion_text(tokenizer, gen_ids[r].tolist(), eos_id) for r in range(len(rows))]
    correct, score = scorer(row_examples, texts)
    correct, score = [bool(c) for c in correct], [float(v) for v in score]
    suites = [ex.suite for ex in row_examples]
    if truncated_is_wrong:
        for r in range(len(rows)):
            if not bool(has_eos[r]):
                correct[r] = False
                if scorer.zero_truncated:
                    score[r] = 0.0
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    return Rollouts(prompt_ids, prompt_mask, gen_ids, step_map, lengths, forwards, tpf,
                    torch.tensor(correct, dtype=torch.bool), torch.tensor(score, dtype=torch.float64),
                    torch.arange(len(examples)).repeat_interleave(group_size), group_size, suites, texts, reasons)


@torch.no_grad()
def evaluate_decoding(model, tokenizer, suites: list[str], n: int, gen_cfg, *, batch_size: int = 64,
                      seed: int = 0, should_stop=None) -> dict[str, float]:
    """Accuracy and mean per-sample TPF (LightningRL's reporting) on the first ``n`` test examples of
    each suite under ``gen_cfg`` (greedy unless it says otherwise). Keys: ``<suite>_acc``,
    ``<suite>_tpf``, ``acc``, ``tpf`` (means over all examples) and ``tpf_ratio`` (Σ tokens / Σ forwards).
    ``should_stop`` (checked before each suite): when it answers True, only the suites scored so far are
    returned, without the totals over all suites."""
    from dllm.eval.tasks import get_suite

    out: dict[str, float] = {}
    tot_ok, tot_tpf, tot_tok, tot_fw, count = 0, 0.0, 0, 0, 0
    for name in suites:
        if should_stop is not None and should_stop():
            return out
        exs = get_suite(name).examples("test", n, seed=seed)
        ro = generate_rollouts(model, tokenizer, exs, 1, gen_cfg, batch_size=batch_size, seed=seed,
                               truncated_is_wrong=False)
        out[f"{name}_acc"] = float(ro.correct.double().mean())
        out[f"{name}_tpf"] = float(ro.tpf.mean())
        tot_ok += int(ro.correct.sum())
        tot_tpf += float(ro.tpf.sum())
        tot_tok += int(ro.lengths.sum())
        tot_fw += int(ro.forwards.sum())
        count += len(ro)
    out["acc"] = tot_ok / max(1, count)
    out["tpf"] = tot_tpf / max(1, count)
    out["tpf_ratio"] = tot_tok / max(1, tot_fw)
    return out
