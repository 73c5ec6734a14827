"""Token editing (LLaDA2.1): mask-to-token plus token-to-token decoding over an exact block cache.

Per block, every step runs one forward and then, from the same logits (token x0 and its probability
p at each slot of the block):

* **M2T**: every masked slot with p > ``threshold`` is committed; if none is, the most confident
  masked slot is (so a step with masks always makes progress);
* **T2T**: every already committed slot of the block (never a prompt slot) whose x0 differs from its
  token and has p > ``editing_threshold`` is replaced by x0. Slots committed in this step are not
  edited in it (the edit test reads the block as it was before the step).

A block is final when a forward over the filled block changes nothing, or after
``max_post_steps`` forwards over the filled block (the reference's post steps: counted at the top
of a step, and the step whose count exceeds the limit runs no forward). The next block then starts.
Only final blocks count for stopping and streaming (``DecodeState.set_final``): an EOS the model
may still edit away does not end the row, and streamed text never changes. (With T2T off, committed
tokens never change, and a row stops and streams as under ``threshold``.)

With ``editing_threshold = 1`` no edit can fire (a probability never exceeds 1), and the loop
skips the post steps whose only purpose is to look for one: ``edit`` is then ``threshold``
decoding over the exact block cache (token for token; M2T compares strictly, ``p > threshold``, as
LLaDA2.1 does, where Fast-dLLM's ``threshold`` commits ``p >= threshold``). The reference would spend
one more forward per block to find no edit.

Counting: a forward counts once for every row it serves (post steps included), so
TPF = answer tokens / forwards, where an edited slot is one token however often it changed. The
edits are reported apart, per row: ``output.stats["edits"]`` (T2T replacements),
``["blocks"]`` (blocks made final) and ``["edit_forwards"]`` (forwards over filled blocks).

Blocks follow the model's grid (``model.spec.block_alignment``): ``"prompt"`` (dllm's block-causal
models: blocks of ``block_length`` from the first generated slot) or ``"position"`` (LLaDA2, as its
published ``generate``: blocks from the first token of each row, so a row's first block holds the
end of its prompt and is shorter on the generated side; the block-causal mask gets each row's
first valid slot as its ``prompt_length``). Rows advance through their blocks independently: a forward covers the union of
the rows' current blocks, fed from the first slot whose cached K/V may be stale, and attention
never crosses rows, so at temperature 0 a row decodes as it does alone.
"""

from __future__ import annotations

import torch

from dllm.decoding.joining import poll
from dllm.decoding.policies import select_best
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.sampling import llada_choice
from dllm.decoding.state import DecodeState


def decode_edit(model, state: DecodeState, gen: torch.Generator | None):
    cfg = state.cfg
    B, P = cfg.block_size, state.P
    dev = state.x.device
    position = model.spec.block_alignment == "position"
    if position:
        anchor = state.key_valid[:, :P].long().argmax(-1)  # each row's first valid slot: where its grid starts
        lead = (-(P - anchor)) % B  # generated slots in the block that holds the end of the prompt
        # None: the grid starts at each row's first valid slot (``block_grid_origin``), joined rows' too
        mask_prompt: int | None = None
    else:
        lead = torch.zeros(state.live, dtype=torch.long, device=dev)
        mask_prompt = P

    def grid_region(lead: torch.Tensor) -> torch.Tensor:
        """Every row decodes whole grid blocks, up to the one that holds its last answer slot."""
        return lead + (state.limit - lead).clamp(min=0).add(B - 1).div(B, rounding_mode="floor") * B

    region = grid_region(lead)
    if state.joining and position:  # room for a joined row's region, whatever its lead
        region = torch.cat([region, grid_region(torch.arange(B, device=dev))])
    state.extend_canvas(int(region.max()) - state.G)
    region = region[: state.live]
    region_end = P + region
    blk_start = torch.full_like(lead, P)
    blk_end = P + torch.where(lead > 0, lead, torch.full_like(lead, B))

    runner = ModelRunner(model, prompt_length=P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos))
    cache = model.allocate_cache(state.key_valid, prompt_length=mask_prompt)
    max_post = cfg.max_post_steps if cfg.editing_threshold < 1.0 else 0
    post = torch.zeros_like(lead)  # post steps of the current block
    exact_end = torch.zeros_like(lead)  # slots below hold exact cached K/V for the row
    rows_total = state.num_rows
    edits = torch.zeros(rows_total, dtype=torch.long, device=dev)
    blocks = torch.zeros(rows_total, dtype=torch.long, device=dev)
    edit_forwards = torch.zeros(rows_total, dtype=torch.long, device=dev)
    # With T2T off a committed token never changes, so stopping and streaming need not wait for final blocks
    editing = cfg.editing_threshold < 1.0
    if editing:
        state.set_final(torch.zeros_like(lead))
    cols = torch.arange(B, device=dev)
    per_row = ("region_end", "blk_start", "blk_end", "post", "exact_end", "final", "gen_start")
    rows = dict(region_end=region_end, blk_start=blk_start, blk_end=blk_end, post=post, exact_end=exact_end,
                final=torch.zeros_like(lead), gen_start=torch.full_like(lead, P))

    def keep_rows(keep: torch.Tensor | None) -> None:
        nonlocal cache
        if keep is None:
            return
        for name in per_row:
            rows[name] = rows[name][keep]
        runner.select_rows(keep)
        cache = cache.select_rows(keep)

    def finalize(done: torch.Tensor, exact: torch.Tensor) -> None:
        """Make the current block of the rows ``done`` final; retire rows past their region."""
        blocks[state.rows[done]] += 1
        rows["exact_end"] = torch.where(done & exact, rows["blk_end"], rows["exact_end"])
        rows["final"] = torch.where(done, rows["blk_end"] - rows["gen_start"], rows["final"])
        if editing:
            state.set_final(rows["final"])
        keep_rows(state.pop_finished())
        if not state.live:
            return
        moved = rows["blk_end"] - rows["gen_start"] == rows["final"]  # the rows whose block just became final
        ended = moved & (rows["blk_end"] >= rows["region_end"])
        if bool(ended.any()):
            keep = state.retire(ended, reason="length")
            keep_rows(keep)
            moved = moved[keep]
        if not state.live:
            return
        rows["blk_start"] = torch.where(moved, rows["blk_end"], rows["blk_start"])
        rows["blk_end"] = torch.where(moved, rows["blk_end"] + B, rows["blk_end"])
        rows["post"] = torch.where(moved, torch.zeros_like(rows["post"]), rows["post"])

    def join() -> None:
        """Place the waiting rows (``dllm.decoding.joining``): each new prompt ends at the slowest row's
        current block start, and its first slot becomes the row's ``exact_end``, so the next forward,
        its first one as when it runs alone, is fed from there and computes the prompt's K/V (the other
        rows' final slots again, from the same tokens: exact under the block-causal mask)."""
        nonlocal cache, edits, blocks, edit_forwards
        lengths = torch.tensor([len(p) for p, _ in state.incoming], dtype=torch.long, device=dev)
        place_at = int(rows["blk_start"].min()) if state.live else state.x.shape[1]
        joined, shift, cache = poll(state, place_at=place_at, runner=runner, cache=cache)
        place_at -= shift
        lead = (-lengths) % B if position else torch.zeros_like(lengths)
        at = torch.full_like(lengths, place_at)
        new = dict(region_end=at + grid_region(lead), blk_start=at,
                   blk_end=at + torch.where(lead > 0, lead, torch.full_like(lead, B)), post=torch.zeros_like(lead),
                   exact_end=at - lengths, final=torch.zeros_like(lead), gen_start=at)
        for name in per_row:
            old = rows[name] if name in ("post", "final") else rows[name] - shift
            rows[name] = torch.cat([old, new[name]])
        rows["exact_end"] = rows["exact_end"].clamp(min=0)
        if editing:
            state.final_len = rows["final"].clone()
        more = torch.zeros(joined, dtype=torch.long, device=dev)
        edits, blocks, edit_forwards = (torch.cat([t, more]) for t in (edits, blocks, edit_forwards))

    while True:
        if state.joining and state.incoming:
            join()
        if not state.live:
            break
        slots = rows["blk_start"][:, None] + cols[None, :]
        in_blk = slots < rows["blk_end"][:, None]
        cur = state.x.gather(1, slots.clamp(max=state.x.shape[1] - 1))
        masked = (cur == state.mask_id) & in_blk
        has_mask = masked.any(-1)
        capped = ~has_mask & (rows["post"] + 1 > max_post)
        if bool(capped.any()):  # filled, and out of post steps: final without another forward
            finalize(capped, exact=torch.zeros_like(capped))
            continue
        rows["post"] = torch.where(has_mask, rows["post"], rows["post"] + 1)
        start = int(rows["exact_end"].min())
        end = int(rows["blk_end"].max())
        logits = runner.cached(state.x, start=start, end=end, cache=cache, mode="prefix", block_size=B)
        state.count_forward()
        edit_forwards[state.rows[~has_mask]] += 1
        # every slot before a row's current grid block is final and was just computed from final tokens
        rows["exact_end"] = torch.maximum(rows["exact_end"], (rows["blk_end"] - B).clamp(min=0))
        width = end - start
        where = torch.where(in_blk, slots - start, torch.zeros_like(slots))
        block_logits = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1]))
        x0, conf = llada_choice(block_logits, temperature=cfg.temperature, remasking="low_confidence",
                                generator=gen, top_p=cfg.top_p, top_k=cfg.top_k)
        above = masked & (conf > cfg.threshold)
        m2t = above | (select_best(conf, masked) & ~above.any(-1, keepdim=True))
        t2t = in_blk & ~masked & (x0 != cur) & (conf > cfg.editing_threshold)
        transfer = m2t | t2t
        edits[state.rows] += t2t.sum(-1)
        # into the forward's window (one spare column takes the slots past a row's block)
        col = torch.where(in_blk, slots - start, torch.full_like(slots, width))
        t_win = torch.zeros(state.live, width + 1, dtype=torch.bool, device=dev).scatter_(1, col, transfer)
        x_win = torch.zeros(state.live, width + 1, dtype=state.x.dtype, device=dev).scatter_(1, col, x0.to(state.x.dtype))
        state.commit(start, t_win[:, :width], x_win[:, :width])
        keep = state.pop_finished()
        if keep is not None:
            has_mask, t2t = has_mask[keep], t2t[keep]
            keep_rows(keep)
            if not state.live:
                if state.joining and state.incoming:
                    yield
                    continue
                break
        settled = ~has_mask & ~t2t.any(-1)  # a forward over the filled block changed nothing
        if bool(settled.any()):
            finalize(settled, exact=settled)
        yield
    return {
        "forward_seconds": runner.forward_seconds,
        "forwards": runner.forwards,
        "edits": edits.tolist(),
        "blocks": blocks.tolist(),
        "edit_forwards": edit_forwards.tolist(),
    }
