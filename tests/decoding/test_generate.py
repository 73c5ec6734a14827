"""Behaviour of model.generate: invariances, stopping, streaming, batching, errors."""

import json

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from dllm.decoding import StrategyError
from dllm.generation import DiffusionGenerationConfig, GenerationConfigError
from dllm.testing import EOS, MASK, PAD, tiny_dream, tiny_llada
from dllm.text import left_pad

# one set of options runs every strategy here (a sweep), so most calls set some their strategy
# does not read; test_registry.py checks that generate warns of them
pytestmark = pytest.mark.filterwarnings("ignore:strategy '.*' does not read:UserWarning")

G, B = 16, 4


@pytest.fixture(scope="module")
def model():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture(scope="module")
def bc_model():
    return tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B)


def _prompt(b=1, length=7, seed=0):
    return torch.randint(0, 60, (b, length), generator=torch.Generator().manual_seed(seed))


def _gen(model, prompt, **kw):
    kw.setdefault("max_new_tokens", G)
    kw.setdefault("block_length", B)
    kw.setdefault("stop_at_eos", False)
    return model.generate(prompt, return_dict_in_generate=True, **kw)


def test_threshold_one_commits_one_token_per_step(model):
    out = _gen(model, _prompt(), strategy="threshold", threshold=1.0)
    assert int(out.num_forwards[0]) == G
    assert sorted(out.step_map[0].tolist()) == list(range(1, G + 1))
    assert float(out.tpf[0]) == pytest.approx(int(out.generated_tokens[0]) / G)


def test_vanilla_one_token_per_step_equals_threshold_one(model):
    p = _prompt(seed=2)
    a = _gen(model, p, strategy="vanilla", steps=G)
    b = _gen(model, p, strategy="threshold", threshold=1.0)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.num_forwards, b.num_forwards)
    assert torch.equal(a.step_map, b.step_map)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("strategy", ["threshold", "factor", "vanilla"])
def test_cache_refreshed_every_step_equals_no_cache(model, cache, strategy):
    p = _prompt(seed=4)
    ref = _gen(model, p, strategy=strategy, threshold=0.7)
    out = _gen(model, p, strategy=strategy, threshold=0.7, cache=cache, refresh_interval=1)
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.equal(out.num_forwards, ref.num_forwards) or strategy == "vanilla"


def test_parallel_decoding_saves_forwards(model):
    p = _prompt(seed=1)
    slow = _gen(model, p, strategy="threshold", threshold=1.0)
    fast = _gen(model, p, strategy="threshold", threshold=0.5)
    assert int(fast.num_forwards[0]) < int(slow.num_forwards[0])
    assert float(fast.tpf[0]) > float(slow.tpf[0])


@pytest.mark.parametrize("tau", [0.5, 0.9])
def test_d2f_sequential_limit_equals_block_decoding_with_exact_cache(bc_model, tau):
    """tau_add = tau_act = 1: one block at a time, fully activated = semi-AR threshold + exact prefix cache."""
    p = _prompt(seed=6)
    d2f = _gen(bc_model, p, strategy="d2f", block_add_threshold=1.0, decoded_token_threshold=1.0, skip_threshold=tau)
    seq = _gen(bc_model, p, strategy="threshold", threshold=tau, cache="prefix")
    nocache = _gen(bc_model, p, strategy="threshold", threshold=tau)
    assert torch.equal(d2f.sequences, seq.sequences) and torch.equal(d2f.sequences, nocache.sequences)
    assert torch.equal(d2f.num_forwards, seq.num_forwards)


def test_d2f_pipeline_overlaps_blocks(bc_model):
    p = _prompt(seed=7)
    seq = _gen(bc_model, p, strategy="d2f", block_add_threshold=1.0, decoded_token_threshold=1.0, skip_threshold=0.6)
    pipe = _gen(bc_model, p, strategy="d2f", block_add_threshold=0.25, decoded_token_threshold=0.5, skip_threshold=0.6)
    assert int(pipe.num_forwards[0]) <= int(seq.num_forwards[0])
    # a later block was being decoded while an earlier one was still open
    sm = pipe.step_map[0].view(-1, B)
    assert any(int(sm[i + 1].min()) < int(sm[i].max()) for i in range(G // B - 1))


def test_d2f_cache_is_exact(bc_model):
    """Logits the pipeline sees (cached) equal an uncached block-causal forward: same tokens as d3llm-style full runs."""
    p = _prompt(seed=8)
    out = _gen(bc_model, p, strategy="d2f", skip_threshold=0.5)
    assert bool((out.step_map[0] >= 1).all())


def _left_pad(prompts):
    return left_pad(prompts, PAD)


STRATEGY_CASES = [
    ("vanilla", "none", {}), ("threshold", "none", {"threshold": 0.7}), ("threshold", "prefix", {"threshold": 0.7}),
    ("threshold", "dual", {"threshold": 0.7}), ("factor", "dual", {}), ("entropy", "none", {"steps": G}),
    ("margin", "prefix", {"steps": G}), ("maskgit_plus", "dual", {"steps": G}), ("d3llm", "none", {"entropy_threshold": 1.0}),
]


@pytest.mark.parametrize("strategy,cache,kw", STRATEGY_CASES + [("d2f", "none", {"skip_threshold": 0.6})])
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_batch_equals_single_rows_with_mixed_prompt_lengths(model, bc_model, strategy, cache, kw, stop_at_eos):
    m = bc_model if strategy == "d2f" else model
    prompts = [_prompt(1, n, seed=n)[0].tolist() for n in (5, 9, 7)]
    ids, mask = _left_pad(prompts)
    batch = _gen(m, ids, attention_mask=mask, strategy=strategy, cache=cache, stop_at_eos=stop_at_eos, **kw)
    L = ids.shape[1]
    for i, p in enumerate(prompts):
        single = _gen(m, torch.tensor([p]), strategy=strategy, cache=cache, stop_at_eos=stop_at_eos, **kw)
        assert torch.equal(batch.sequences[i, L:], single.sequences[0, len(p):]), (strategy, i)
        assert int(batch.num_forwards[i]) == int(single.num_forwards[0])
        assert batch.finish_reason[i] == single.finish_reason[0]


def _eos_model(**kw):
    """A model whose head strongly prefers EOS after the first few generated tokens' worth of training."""
    m = tiny_llada(initializer_range=0.5, **kw)
    with torch.no_grad():
        head = m.model.transformer["ff_out"].weight
        head[EOS] = head[EOS] * 0 + m.model.transformer["ln_f"].weight.sign() * 3.0
    return m


@pytest.mark.parametrize("strategy,extra", [("threshold", {}), ("d2f", {"attention_policy": "block_causal", "block_size": B})])
def test_eos_early_stop_saves_forwards(strategy, extra):
    m = _eos_model(**extra)
    p = _prompt(seed=3)
    full = _gen(m, p, strategy=strategy, threshold=0.9, skip_threshold=0.9, max_new_tokens=32)
    early = _gen(m, p, strategy=strategy, threshold=0.9, skip_threshold=0.9, max_new_tokens=32, stop_at_eos=True)
    first = int((full.sequences[0, 7:] == EOS).nonzero()[0])
    assert first < 32 - B  # the model does end early
    assert int(early.num_forwards[0]) < int(full.num_forwards[0])
    # the text up to EOS is the same; everything after is EOS
    assert torch.equal(early.sequences[0, 7: 7 + first + 1], full.sequences[0, 7: 7 + first + 1])
    assert bool((early.sequences[0, 7 + first:] == EOS).all())
    assert early.finish_reason == ["stop"]
    assert int(early.generated_tokens[0]) == first + 1


class CollectingStreamer(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("strategy,cache", [("threshold", "dual"), ("vanilla", "none"), ("d2f", "none")])
def test_streamer_receives_committed_text_in_order(model, bc_model, strategy, cache):
    m = bc_model if strategy == "d2f" else model
    p = _prompt(seed=9)
    streamer = CollectingStreamer()
    out = _gen(m, p, strategy=strategy, cache=cache, threshold=0.7, skip_threshold=0.7, streamer=streamer)
    assert streamer.ended and streamer.chunks[0] == p[0].tolist()
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    gen = out.sequences[0, 7:].tolist()
    n = int(out.generated_tokens[0])
    expected = gen[: n - 1] if gen[n - 1] == EOS else gen[:n]
    assert streamed == expected
    assert len(streamer.chunks) - 1 >= min(G // B, 1 + (n - 1) // B)  # at least once per block


class CharTokenizer:
    eos_token_id = EOS
    mask_token_id = MASK

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids if i < 60)


def test_stop_strings_on_committed_text(model):
    p = _prompt(seed=11)
    ref = _gen(model, p, strategy="threshold", threshold=1.0)
    text = CharTokenizer().decode(ref.sequences[0, 7:].tolist())
    stop = text[3:5]
    out = _gen(model, p, strategy="threshold", threshold=1.0, stop_strings=[stop], tokenizer=CharTokenizer())
    assert out.finish_reason == ["stop"]
    assert int(out.num_forwards[0]) < int(ref.num_forwards[0])
    got = CharTokenizer().decode(out.sequences[0, 7:].tolist())
    assert stop in got and got.index(stop) == text.index(stop)


def test_sampling_is_seeded(model):
    p = _prompt(seed=12)
    a = _gen(model, p, strategy="threshold", temperature=1.0, seed=7, threshold=0.8)
    b = _gen(model, p, strategy="threshold", temperature=1.0, seed=7, threshold=0.8)
    c = _gen(model, p, strategy="threshold", temperature=1.0, seed=8, threshold=0.8)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)


def test_cfg_and_random_remasking_run(model):
    p = _prompt(seed=13)
    plain = _gen(model, p, strategy="vanilla")
    guided = _gen(model, p, strategy="vanilla", cfg_scale=2.0)
    assert int(guided.num_forwards[0]) == int(plain.num_forwards[0]) == G
    assert not torch.equal(plain.sequences, guided.sequences)
    rnd = _gen(model, p, strategy="vanilla", remasking="random", seed=0)
    assert bool((rnd.sequences[0, 7:] != MASK).all())


def test_dream_model_decodes_with_caches():
    m = tiny_dream(initializer_range=0.5)
    p = _prompt(seed=14)
    none = _gen(m, p, strategy="threshold", threshold=0.7)
    refreshed = _gen(m, p, strategy="threshold", threshold=0.7, cache="dual", refresh_interval=1)
    assert torch.equal(none.sequences, refreshed.sequences)
    dual = _gen(m, p, strategy="threshold", threshold=0.7, cache="dual")
    assert bool((dual.sequences[0, 7:] != MASK).all())


def test_invalid_configs_raise_clear_errors(model):
    with pytest.raises(GenerationConfigError, match="unknown strategy 'fast'; valid: vanilla, threshold"):
        DiffusionGenerationConfig(strategy="fast")
    rounded = DiffusionGenerationConfig(max_new_tokens=10, block_length=4)  # any size: whole blocks are decoded
    assert (rounded.canvas_tokens, rounded.num_blocks) == (12, 3)
    with pytest.raises(GenerationConfigError, match="threshold must be in"):
        DiffusionGenerationConfig(threshold=1.5)
    for kw, msg in [({"threshold": "0.9"}, "threshold='0.9' must be a finite number"),
                    ({"max_new_tokens": 64.0}, "max_new_tokens must be an integer"),
                    ({"stop_at_eos": "no"}, "stop_at_eos must be true or false")]:
        with pytest.raises(GenerationConfigError, match=msg):  # named, not a TypeError from a comparison
            DiffusionGenerationConfig(**kw)
    assert DiffusionGenerationConfig(threshold=1, top_p=None).threshold == 1
    with pytest.raises(GenerationConfigError, match="cache='l2'; valid: none, prefix, dual"):
        DiffusionGenerationConfig(cache="l2")
    with pytest.raises(GenerationConfigError, match="steps=5 must be a multiple"):
        DiffusionGenerationConfig(strategy="vanilla", steps=5, max_new_tokens=16, block_length=4)
    with pytest.raises(GenerationConfigError, match="unknown generation option"):
        model.generate(_prompt(), thresold=0.3)
    with pytest.raises(StrategyError, match="block-causal"):
        model.generate(_prompt(), strategy="d2f")
    with pytest.raises(GenerationConfigError, match="left-padded"):
        model.generate(_prompt(), attention_mask=torch.tensor([[1, 1, 1, 1, 1, 1, 0]]))
    with pytest.raises(GenerationConfigError, match="mask token"):
        model.generate(torch.tensor([[1, 2, MASK]]))
    with pytest.raises(GenerationConfigError, match="LongTensor .* got torch.float32"):
        model.generate(_prompt().float())
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(GenerationConfigError, match=rf"outside the model's vocabulary \[0, {vocab}\)"):
        model.generate(torch.tensor([[1, 2, vocab]]))
    short = tiny_llada(max_sequence_length=12)
    with pytest.warns(UserWarning, match=r"prompt \(7 tokens\) \+ max_new_tokens \(8\) exceeds the model's context length \(12\)"):
        short.generate(_prompt(), max_new_tokens=8, block_length=8, steps=8)  # a warning: RoPE still runs past it


def test_config_json_roundtrip_and_file(tmp_path, model):
    cfg = DiffusionGenerationConfig(strategy="factor", factor=1.5, cache="dual", stop_strings=("\n\n",), seed=3)
    assert DiffusionGenerationConfig.from_dict(json.loads(cfg.to_json_string())) == cfg
    (tmp_path / "generation_config.json").write_text(json.dumps({"transformers_version": "5", "steps": 512}))
    cfg.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "generation_config.json").read_text())
    assert data["steps"] == 512 and data["dllm"]["strategy"] == "factor"
    assert DiffusionGenerationConfig.from_pretrained(tmp_path) == cfg
    model.save_pretrained(tmp_path / "m")
    cfg.save_pretrained(tmp_path / "m")
    from dllm.loading import load_model

    loaded = load_model(tmp_path / "m")
    assert loaded.diffusion_generation_config == cfg
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.strategy = "vanilla"  # frozen


@pytest.mark.parametrize("strategy", ["threshold", "d2f"])
def test_batch_streamer_rows_and_cancellation(model, bc_model, strategy):
    from dllm.decoding.streaming import CollectingBatchStreamer

    m = bc_model if strategy == "d2f" else model
    prompts = [_prompt(1, n, seed=n)[0].tolist() for n in (5, 8)]
    ids, mask = _left_pad(prompts)
    streamer = CollectingBatchStreamer()
    out = _gen(m, ids, attention_mask=mask, strategy=strategy, threshold=0.7, skip_threshold=0.7, streamer=streamer)
    for r in range(2):
        gen = out.sequences[r, ids.shape[1]:].tolist()
        n = int(out.generated_tokens[r])
        assert streamer.tokens[r] == (gen[: n - 1] if gen[n - 1] == EOS else gen[:n])
        assert streamer.finished[r] == out.finish_reason[r]

    from dllm.decoding import DecodeSession

    # the owner cancels row 1 between steps, once it has streamed something: it ends at the next commit
    c = CollectingBatchStreamer()
    session = DecodeSession(m, m.diffusion_generation_config.replace(
        strategy=strategy, threshold=0.7, skip_threshold=0.7, max_new_tokens=G, block_length=B,
        return_dict_in_generate=True), streamer=c)
    session.add_rows(ids, mask)
    while session.step():
        if c.chunks.get(1, 0) >= 1:
            session.cancel(1)
    out2 = session.output()
    assert out2.finish_reason[1] == "cancelled" and c.finished[1] == "cancelled"
    assert int(out2.num_forwards[1]) < int(out.num_forwards[1])
    assert torch.equal(out2.sequences[0], out.sequences[0])  # the other row is unaffected

    # a stopping criterion ends row 1 in the very commit that gave it its first tokens
    c3 = CollectingBatchStreamer()
    session = DecodeSession(m, session.cfg, streamer=c3, criteria=[lambda rows: [r for r in rows if c3.chunks.get(r)]])
    session.add_rows(ids, mask)
    out3 = session.run()
    assert all(c3.chunks[r] == 1 for r in range(2)) and out3.finish_reason == ["stop", "stop"]
    assert int(out3.num_forwards[1]) <= int(out2.num_forwards[1])


@pytest.mark.parametrize("strategy", ["threshold", "vanilla", "entropy"])
def test_block_causal_models_use_the_exact_block_cache(bc_model, strategy):
    """cache='none' on a block-causal model feeds only the current block against exactly cached blocks."""
    p = _prompt(seed=15)
    exact = _gen(bc_model, p, strategy=strategy, threshold=0.6, steps=G)
    full = _gen(bc_model, p, strategy=strategy, threshold=0.6, steps=G, cache="prefix", refresh_interval=1)
    assert torch.equal(exact.sequences, full.sequences)
    assert torch.equal(exact.num_forwards, full.num_forwards) or strategy != "threshold"


def test_d3llm_delayed_cache_refreshing_every_step_equals_no_cache(model):
    p = _prompt(seed=16)
    ref = _gen(model, p, strategy="d3llm", entropy_threshold=1.0)
    out = _gen(model, p, strategy="d3llm", entropy_threshold=1.0, cache="prefix", refresh_interval=1)
    assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.num_forwards, ref.num_forwards)


def test_d3llm_entropy_rule_commits_in_parallel(model):
    """Regression: the mask token's -inf logit once made every entropy NaN, so the rule never fired."""
    p = _prompt(seed=16)
    forced = _gen(model, p, strategy="d3llm", entropy_threshold=0.0)  # (nearly) only the forced commits
    many = _gen(model, p, strategy="d3llm", entropy_threshold=100.0)  # every candidate passes
    assert int(many.num_forwards[0]) < min(G // 2, int(forced.num_forwards[0]))
    assert bool((many.sequences[0, p.shape[1]:] != model.config.mask_token_id).all())


@pytest.mark.parametrize("delay,interval", [(1, 4), (2, None), (1, 1)])
def test_d3llm_delayed_cache_decodes_each_row_of_a_batch_as_alone(model, delay, interval):
    """Each row refreshes on its own schedule (its forwards, its stable prefix), so a batch changes no row."""
    prompts = [_prompt(1, n, seed=n)[0].tolist() for n in (5, 9, 3)]
    ids, mask = _left_pad(prompts)
    kw = dict(strategy="d3llm", entropy_threshold=1.0, cache="prefix", cache_delay=delay, refresh_interval=interval)
    out = _gen(model, ids, attention_mask=mask, **kw)
    for i, p in enumerate(prompts):
        alone = _gen(model, torch.tensor([p]), **kw)
        assert out.sequences[i, ids.shape[1]:].tolist() == alone.sequences[0, len(p):].tolist(), i
        assert int(out.num_forwards[i]) == int(alone.num_forwards[0])
        assert torch.equal(out.step_map[i], alone.step_map[0])
