"""Tensor-parallel shards on 2 gloo CPU processes equal one process: identical tokens and forward counts
(bundled tiny: threshold + dual cache; tiny-d2f: d2f and lopa) and logits within 1e-5 for a tiny random
model of every family (LLaDA GQA, Dream, SDAR, Fast-dLLM v2, LLaDA-MoE, LLaDA2, SDAR-MoE).

A 2 x 2 branch x tensor mesh (4 gloo processes: LoPA branches over 2 replicas, each sharded in 2) equals
one process too, on tiny-d2f and on the bidirectional tiny.

One spawn of the workers runs every case of a world (process start-up dominates); the parent computes the
single-process references and compares.
"""

from __future__ import annotations

import os
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

WORLD = 2
PROMPTS = ("What is 123 + 45 ?", "reverse : Ann Bob Cal")  # task-suite prompts the bundled models answer
FAMILIES = ("llada-gqa", "dream", "sdar", "fast-dllm-v2", "llada-moe", "llada2", "sdar-moe")
# each family's fixture decoded greedily by its own decoder (threshold where the family has none)
FAMILY_STRATEGY = {"llada-gqa": "threshold", "dream": "threshold", "sdar": "sdar", "fast-dllm-v2": "fast_dllm_v2",
                   "llada-moe": "threshold", "llada2": "edit", "sdar-moe": "sdar"}


def _family_model(name: str):
    from dllm import testing

    if name == "llada-gqa":
        return testing.tiny_llada(seed=1, n_kv_heads=2, initializer_range=0.1)
    if name == "dream":
        return testing.tiny_dream(seed=1, initializer_range=0.1)
    if name in ("sdar", "fast-dllm-v2"):
        return testing.tiny_block_model(name, seed=1)
    return testing.tiny_moe_model(name, seed=1)


def _family_ids(name: str) -> torch.Tensor:
    vocab = 60 if name in ("llada-gqa", "dream") else 400
    return torch.randint(4, vocab, (2, 12), generator=torch.Generator().manual_seed(0))


def _generation_cases():
    from dllm.decoding.config import DiffusionGenerationConfig
    from dllm.loading import load_model, resolve_model_path

    base = dict(max_new_tokens=16, return_dict_in_generate=True, pad_token_id=0)
    tiny = load_model(resolve_model_path("tiny"))
    d2f = load_model(resolve_model_path("tiny-d2f"))
    return {
        "threshold-dual": (tiny, DiffusionGenerationConfig(strategy="threshold", cache="dual", threshold=0.999,
                                                           block_length=8, mask_token_id=3, **base)),
        "d2f": (d2f, d2f.diffusion_generation_config.replace(block_length=8, skip_threshold=0.999, **base)),
        "lopa": (d2f, d2f.diffusion_generation_config.replace(strategy="lopa", lopa_branches=2, block_length=8,
                                                              **base)),
    }


def _prompt_batch():
    import dllm
    from dllm.text import encode_prompts

    return encode_prompts(dllm.load_tokenizer("tiny"), list(PROMPTS))


def _run_generation(model, cfg) -> dict:
    ids, mask = _prompt_batch()
    out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    return {"sequences": out.sequences, "num_forwards": out.num_forwards}


def _results(shard) -> dict:
    """Every case's outputs; ``shard`` makes each model a tensor-parallel shard first."""
    from dllm.parallel.tensor import shard_model

    res = {}
    models = {}
    for name, (model, cfg) in _generation_cases().items():
        if shard and id(model) not in models:
            shard_model(model)
        models[id(model)] = model
        res[name] = _run_generation(model, cfg)
    for fam in FAMILIES:
        model = _family_model(fam)
        if shard:
            shard_model(model)
        with torch.inference_mode():
            ids = _family_ids(fam)
            res[fam] = model(ids).logits
            # a cached forward: the shard's cache holds its local KV heads only
            valid = torch.ones_like(ids, dtype=torch.bool)
            cache = model.allocate_cache(valid, prompt_length=ids.shape[1] // 2)
            res[fam + "-cached"] = model(ids, kv_cache=cache, cache_mode="fill").logits
            res[fam + "-kv-heads"] = cache.keys[0].shape[1]
        cfg = model.diffusion_generation_config.replace(strategy=FAMILY_STRATEGY[fam], max_new_tokens=16,
                                                        temperature=0.0, return_dict_in_generate=True)
        out = model.generate(_family_ids(fam), generation_config=cfg)
        res[fam + "-generate"] = {"sequences": out.sequences, "num_forwards": out.num_forwards}
    return res


@contextmanager
def _gloo_rank(rank: int, init: str, world: int, out_dir: str):
    """One spawned rank: a gloo process group around the body; a failure's traceback goes to rank{r}.err."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        yield
    except BaseException:
        Path(out_dir, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _worker(rank: int, init: str, out_dir: str) -> None:
    with _gloo_rank(rank, init, WORLD, out_dir):
        res = _results(shard=True)
        from dllm.parallel.tensor import shard_model

        bad = _family_model("dream")
        bad.model.layers[0].num_kv_heads = 1  # as a checkpoint with one KV head would be
        try:
            shard_model(bad)
        except ValueError as err:
            res["error"] = str(err)
            res["error-untouched"] = getattr(bad, "tensor_parallel", None) is None
        torch.save(res, Path(out_dir, f"rank{rank}.pt"))


def _spawn(tmp: Path, world: int, target, reference, *args) -> tuple[object, list[dict]]:
    """Run ``target(rank, init, out_dir, *args)`` on ``world`` spawned processes while the parent computes
    ``reference()`` on one thread; returns the reference and each rank's saved ``rank{r}.pt``."""
    import torch.multiprocessing as mp

    init = Path(tmp, "store").resolve().as_uri()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, init, str(tmp), *args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = reference()
    finally:
        torch.set_num_threads(threads)
    for p in procs:
        p.join(timeout=180)
        if p.is_alive():
            p.kill()
    errors = [f.read_text() for f in sorted(tmp.glob("*.err"))]
    assert not errors, "\n".join(errors)
    return ref, [torch.load(Path(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("tp"), WORLD, _worker, lambda: _results(shard=False))


@pytest.mark.parametrize("case", ["threshold-dual", "d2f", "lopa"])
@pytest.mark.slow
def test_generation_identical_to_one_process(runs, case):
    reference, ranks = runs
    for res in ranks:
        assert torch.equal(res[case]["sequences"], reference[case]["sequences"])
        assert torch.equal(res[case]["num_forwards"], reference[case]["num_forwards"])
    assert (reference[case]["sequences"][:, -16:] != 3).all()  # the canvas was decoded, not left masked
    assert int(reference[case]["num_forwards"].max()) >= 2  # several forwards, so the cache was reused


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_close_for_every_family(runs, family):
    reference, ranks = runs
    for res in ranks:
        for key in (family, family + "-cached"):
            assert res[key].shape == reference[key].shape
            torch.testing.assert_close(res[key], reference[key], atol=1e-5, rtol=0)
        assert res[family + "-kv-heads"] * WORLD == reference[family + "-kv-heads"]
    assert reference[family].std() > 0.5  # logits of a useful size, so atol 1e-5 is a real bound
    assert torch.equal(ranks[0][family], ranks[1][family])  # the gathered head: every rank has the same logits


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_decodes_token_for_token_as_one_process(runs, family):
    """Each family's tiny fixture under its own decoder (sdar, fast_dllm_v2, edit; threshold for the others)."""
    reference, ranks = runs
    want = reference[family + "-generate"]
    for res in ranks:
        assert torch.equal(res[family + "-generate"]["sequences"], want["sequences"])
        assert torch.equal(res[family + "-generate"]["num_forwards"], want["num_forwards"])
    assert int(want["num_forwards"].min()) >= 2


def test_indivisible_heads_are_refused(runs):
    _, ranks = runs
    for res in ranks:
        assert "KV heads = 1" in res["error"] and "2 ranks" in res["error"]
        assert res["error-untouched"]


def test_divisibility_is_checked_before_any_change():
    from dllm.parallel.tensor import check_divisible
    from dllm.testing import tiny_dream

    with pytest.raises(ValueError, match=r"attention heads = 4, KV heads = 2"):
        check_divisible(tiny_dream(), 3)
    with pytest.raises(ValueError, match=r"MLP width = 90"):
        check_divisible(tiny_dream(intermediate_size=90), 4)
    check_divisible(tiny_dream(), 2)


def test_cli_rejects_a_world_that_differs(monkeypatch):
    """--tensor-parallel N outside torchrun (WORLD_SIZE unset) says how to launch it."""
    from typer.testing import CliRunner

    from dllm.cli import app

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = CliRunner().invoke(app, ["generate", "hi", "--tensor-parallel", "2"])
    assert result.exit_code != 0
    assert "torchrun --nproc-per-node 2" in result.output



@pytest.mark.slow
def test_generate_under_torchrun_prints_once_and_matches_one_process():
    """``torchrun --nproc-per-node 2 -m dllm generate --tensor-parallel 2``: rank 0 alone prints, the same
    answer and forward count as one process."""
    import json
    import subprocess
    import sys

    from typer.testing import CliRunner

    from dllm.cli import app

    args = ["generate", "What is 123 + 45 ?", "--strategy", "threshold", "--cache", "dual", "--threshold", "0.999",
            "--json"]
    single = CliRunner().invoke(app, args)
    assert single.exit_code == 0, single.output
    [want] = [json.loads(line) for line in single.stdout.splitlines() if line.startswith("{")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "dllm", *args, "--tensor-parallel", "2"], capture_output=True, text=True, env=env,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(got) == 1  # rank 0 only
    assert got[0]["text"] == want["text"] == "168"
    assert got[0]["num_forwards"] == want["num_forwards"] >= 2


# -- a 2 x 2 branch x tensor mesh: rank r = b * 2 + t ---------------------------------------------------
BRANCH, TENSOR = 2, 2


def _mesh_cases():
    """LoPA with 3 lookahead branches: groups 0-1 on branch rank 0, 2-3 on branch rank 1 (whose winners
    these prompts pick in some rounds); the block-causal tiny-d2f and the bidirectional tiny (dual cache)."""
    from dllm.loading import load_model, resolve_model_path

    base = dict(strategy="lopa", lopa_branches=3, block_length=8, max_new_tokens=24, stop_at_eos=False,
                return_dict_in_generate=True, pad_token_id=0)
    d2f = load_model(resolve_model_path("tiny-d2f"))
    tiny = load_model(resolve_model_path("tiny"))
    return {
        "lopa-d2f": (d2f, d2f.diffusion_generation_config.replace(skip_threshold=0.999, **base)),
        "lopa-bidirectional": (tiny, tiny.diffusion_generation_config.replace(cache="dual", threshold=0.999,
                                                                              **base)),
    }


def _mesh_generation(model, cfg) -> dict:
    ids, mask = _prompt_batch()
    out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    return {"sequences": out.sequences, "num_forwards": out.num_forwards, "winners": out.stats["lopa_winners"],
            "steps": out.stats["steps"]}


def _mesh_reference() -> dict:
    return {name: _mesh_generation(model, cfg) for name, (model, cfg) in _mesh_cases().items()}


def _mesh_worker(rank: int, init: str, out_dir: str) -> None:
    import torch.distributed as dist

    from dllm.decoding.lopa.branch_parallel import BranchParallelExecutor, serve_branches
    from dllm.parallel.mesh import init_mesh
    from dllm.parallel.tensor import shard_model

    with _gloo_rank(rank, init, BRANCH * TENSOR, out_dir):
        mesh = init_mesh(BRANCH, TENSOR)
        res = {"branch_group": dist.get_process_group_ranks(mesh.branch_group),
               "tensor_group": dist.get_process_group_ranks(mesh.tensor_group),
               "coords": (mesh.branch_rank, mesh.tensor_rank)}
        for name, (model, cfg) in _mesh_cases().items():
            shard_model(model, group=mesh.tensor_group)
            forwards = []
            model.register_forward_pre_hook(lambda *_, box=forwards: box.append(1))
            if mesh.branch_rank == 0:
                with BranchParallelExecutor.from_process_group(model, group=mesh.branch_group) as ex:
                    res[name] = _mesh_generation(ex, cfg)
            else:
                serve_branches(model, group=mesh.branch_group)
            res[name + "-model-forwards"] = len(forwards)
            res[name + "-kv-heads"] = model.spec.num_kv_heads
        torch.save(res, Path(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("mesh"), BRANCH * TENSOR, _mesh_worker, _mesh_reference)


@pytest.mark.slow  # 4 processes: ~25 s on 2 cores
def test_branch_tensor_mesh_groups(mesh_runs):
    """Rank r = b * 2 + t; tensor groups {0, 1}, {2, 3}; branch groups {0, 2}, {1, 3}."""
    _, ranks = mesh_runs
    for r, res in enumerate(ranks):
        b, t = divmod(r, TENSOR)
        assert res["coords"] == (b, t)
        assert res["tensor_group"] == [b * TENSOR + i for i in range(TENSOR)]
        assert res["branch_group"] == [i * TENSOR + t for i in range(BRANCH)]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["lopa-d2f", "lopa-bidirectional"])
def test_branch_tensor_mesh_equals_one_process(mesh_runs, case):
    reference, ranks = mesh_runs
    ref = reference[case]
    for res in ranks[:TENSOR]:  # replica 0's tensor ranks each drive their branch group and hold the result
        assert torch.equal(res[case]["sequences"], ref["sequences"])
        assert torch.equal(res[case]["num_forwards"], ref["num_forwards"])
        assert res[case]["winners"] == ref["winners"] and res[case]["steps"] == ref["steps"]
    assert any(w >= 2 for row in ref["winners"] for w in row)  # a branch evaluated on replica 1 won a round
    assert int(ref["num_forwards"].max()) >= 2
    assert (ref["sequences"][:, -24:] != 3).all()
    for res in ranks[TENSOR:]:  # replica 1 forwarded its branch share through its own tensor group
        assert case not in res and res[case + "-model-forwards"] >= 1
    assert all(res[case + "-kv-heads"] == 2 for res in ranks)  # 4 KV heads sharded in 2


def test_cli_rejects_a_mesh_world_that_differs(monkeypatch):
    from typer.testing import CliRunner

    from dllm.cli import app

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = CliRunner().invoke(app, ["generate", "hi", "--tensor-parallel", "2", "--branch-parallel", "2"])
    assert result.exit_code == 2
    assert "error: --tensor-parallel 2 --branch-parallel 2 runs under torchrun --nproc-per-node 4" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow  # 4 processes under torchrun: ~20 s on 2 cores
def test_generate_on_a_2x2_mesh_under_torchrun_matches_one_process():
    """``torchrun --nproc-per-node 4 -m dllm generate --branch-parallel 2 --tensor-parallel 2``: rank 0 alone
    prints the single-process answer and forward count."""
    import json
    import subprocess
    import sys

    from typer.testing import CliRunner

    from dllm.cli import app

    args = ["generate", PROMPTS[0], "-m", "tiny-d2f", "--strategy", "lopa", "--lopa-branches", "3", "--set",
            "skip_threshold=0.999", "--json"]
    single = CliRunner().invoke(app, args)
    assert single.exit_code == 0, single.output
    [want] = [json.loads(line) for line in single.stdout.splitlines() if line.startswith("{")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                          "-m", "dllm", *args, "--branch-parallel", "2", "--tensor-parallel", "2"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(got) == 1  # rank 0 only
    assert (got[0]["text"], got[0]["num_forwards"], got[0]["generated_tokens"]) == (
        want["text"], want["num_forwards"], want["generated_tokens"])
    assert want["text"] == "168" and want["num_forwards"] >= 2
