"""lm-evaluation-harness model ``dllm``: generation through our decoding config, likelihood by Monte Carlo.

``generate_until`` runs ``model.generate`` with the strategy and options given in ``--model_args``;
``loglikelihood`` is LLaDA's Monte Carlo estimate of log p(continuation | context): mask k of the
continuation's L tokens (k stratified over the batch, positions uniform), sum the masked
cross-entropy divided by the mask ratio k/L, average over ``mc_num`` samples. It is a lower bound
(ELBO) on the log-likelihood, which is what LLaDA reports for multiple-choice tasks.

lm-eval discovers models by import, so run it through our entry point, which registers ``dllm``
and hands the command line to lm-eval unchanged:

    dllm lm-eval --model dllm --model_args pretrained=tiny,strategy=threshold,threshold=0.9 --tasks TASK
    python -m dllm.eval.lm_eval_adapter --model dllm ...   # the same
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as err:  # the optional extra is missing
    raise ImportError("lm-eval is not installed: pip install 'dllm[lm-eval]'") from err

from dllm.decoding.config import DiffusionGenerationConfig

DEFAULT_MODEL = "tiny"  # ``pretrained`` when --model_args leaves it out
_MODEL_ARGS = {"pretrained", "dtype", "device", "batch_size", "mc_num", "mc_batch_size", "chat", "max_length", "seed"}


def forward_process(seq: torch.Tensor, prompt_len: int, mask_id: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA's stratified masking of the continuation: row i masks k_i of L tokens, k_i spread over [1, L]."""
    b, total = seq.shape
    L = total - prompt_len
    k = int(torch.randint(1, L + 1, (), generator=gen))
    counts = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b)).long()
    counts = ((counts - 1) % L) + 1
    is_mask = torch.arange(L)[None, :].repeat(b, 1) < counts[:, None]
    for i in range(b):
        is_mask[i] = is_mask[i][torch.randperm(L, generator=gen)]
    is_mask = torch.cat([torch.zeros(b, prompt_len, dtype=torch.bool), is_mask], 1).to(seq.device)
    noisy = torch.where(is_mask, torch.full_like(seq, mask_id), seq)
    return noisy, (counts.double() / L).to(seq.device)


@torch.no_grad()
def mc_loglikelihood(model, context: list[int], continuation: list[int], *, mask_id: int, mc_num: int = 32,
                     batch_size: int = 16, seed: int = 0) -> float:
    if not continuation:
        return 0.0
    device = model.get_input_embeddings().weight.device
    seq = torch.tensor([context + continuation], device=device).repeat(batch_size, 1)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(max(1, mc_num // batch_size)):
        noisy, ratio = forward_process(seq, len(context), mask_id, gen)
        logits = model(noisy).logits.float()
        masked = noisy == mask_id
        ce = F.cross_entropy(logits[masked], seq[masked], reduction="none").double()
        weights = (1.0 / ratio)[:, None].expand_as(masked)[masked]
        losses.append(float((ce * weights).sum() / batch_size))
    return -sum(losses) / len(losses)


def _check_option_names(gen_kwargs: dict) -> None:
    fields = set(DiffusionGenerationConfig.__dataclass_fields__)
    if unknown := sorted(set(gen_kwargs) - fields):
        raise ValueError(f"unknown dllm model_args {unknown}; valid: {sorted(fields | _MODEL_ARGS)}")


def generation_config_from_args(base: DiffusionGenerationConfig, gen_kwargs: dict) -> DiffusionGenerationConfig:
    """``base`` with the decoding options of ``--model_args``; ValueError names an unknown option, a bad value
    or an option the strategy does not read."""
    from dllm.decoding.registry import unread_options_error

    _check_option_names(gen_kwargs)
    cfg = base.replace(**gen_kwargs)
    if (unread := unread_options_error(cfg.strategy, gen_kwargs)) is not None:
        raise ValueError(f"dllm model_args: {unread}")
    return cfg


def check_model_args(args: dict) -> None:
    """What ``DLLMEvalModel(**args)`` checks, without loading the weights: the model path, the option names
    and, where the checkpoint keeps dllm's decoding defaults, the decoding options' values."""
    from dllm.loading import resolve_model_path

    path = resolve_model_path(str(args.get("pretrained", DEFAULT_MODEL)))
    gen_kwargs = {k: v for k, v in args.items() if k not in _MODEL_ARGS}
    base = DiffusionGenerationConfig.from_pretrained(path)
    if base is None:  # a checkpoint without them takes its format's defaults, known once the model is built
        _check_option_names(gen_kwargs)
    else:
        generation_config_from_args(base, gen_kwargs)


def _dllm_model_args(argv: list[str]) -> dict | None:
    """The ``--model_args`` of a command line that runs the ``dllm`` model, read by lm-eval's own parser;
    None for any other command line, including one lm-eval's parser refuses (it says why when it runs)."""
    import contextlib
    import io

    if not any(a in ("--model_args", "-a") or a.startswith("--model_args=") for a in argv) \
            or any(a in ("-h", "--help") for a in argv):
        return None
    from lm_eval.__main__ import HarnessCLI

    saved = sys.argv
    try:
        sys.argv = ["lm_eval", *argv]
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = HarnessCLI().parse_args()
    except (Exception, SystemExit):
        return None
    finally:
        sys.argv = saved
    model_args = getattr(args, "model_args", None)
    return model_args if getattr(args, "model", None) == "dllm" and isinstance(model_args, dict) else None


@register_model("dllm")
class DLLMEvalModel(LM):
    def __init__(self, pretrained: str = DEFAULT_MODEL, batch_size: int | str = 1, mc_num: int = 32,
                 mc_batch_size: int = 16,
                 chat: bool = True, dtype: str | None = None, device: str | None = None, seed: int = 0, **gen_kwargs):
        super().__init__()
        from dllm.loading import load_model, resolve_model_path
        from dllm.text import load_tokenizer_for

        path = resolve_model_path(pretrained)
        self.model = load_model(path, dtype=dtype, device=device)
        self.tokenizer = load_tokenizer_for(path)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 1
        self.mc_num, self.mc_batch_size, self.seed = int(mc_num), int(mc_batch_size), int(seed)
        self.chat = str(chat).lower() not in ("false", "0", "no")
        self.gen_config = generation_config_from_args(self.model.diffusion_generation_config, gen_kwargs)
        from dllm.special_ids import require_mask_token

        self.mask_id = require_mask_token(self.model, self.tokenizer)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, args: dict, additional_config: dict | None = None):
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("batch_size", "device")}
        # lm-eval passes its --device default ("cuda") even on CPU machines: a hint, not a demand.
        if str(extra.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            extra.pop("device")
        return cls(**{**extra, **args})

    # -- generation --------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        from dllm.text import generate_text

        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="dllm generate_until"):
            context, kwargs = req.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            overrides = {"stop_strings": tuple(until)}
            if "max_gen_toks" in kwargs:
                block = self.gen_config.block_size
                overrides["max_new_tokens"] = max(block, -(-int(kwargs["max_gen_toks"]) // block) * block)
            if kwargs.get("temperature"):
                overrides["temperature"] = float(kwargs["temperature"])
            res = generate_text(self.model, self.tokenizer, context, chat=self.chat, generation_config=self.gen_config,
                                **overrides)[0]
            out.append(res.text)
        return out

    # -- likelihood --------------------------------------------------------------------------------
    def _encode(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        whole = self.tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        ctx = self.tokenizer(context, add_special_tokens=False)["input_ids"]
        if whole[: len(ctx)] == ctx:
            return ctx, whole[len(ctx):]
        return ctx, self.tokenizer(continuation, add_special_tokens=False)["input_ids"]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        from tqdm import tqdm

        results = []
        for req in tqdm(requests, disable=disable_tqdm, desc="dllm loglikelihood"):
            context, continuation = req.args
            ctx, cont = self._encode(context, continuation)
            ll = mc_loglikelihood(self.model, ctx, cont, mask_id=self.mask_id, mc_num=self.mc_num,
                                  batch_size=self.mc_batch_size, seed=self.seed)
            results.append((ll, self._greedy(ctx, cont)))
        return results

    @torch.no_grad()
    def _greedy(self, ctx: list[int], cont: list[int]) -> bool:
        """Whether one denoising step from a fully masked continuation predicts it exactly."""
        if not cont:
            return True
        device = self.model.get_input_embeddings().weight.device
        x = torch.tensor([ctx + [self.mask_id] * len(cont)], device=device)
        pred = self.model(x).logits[0, len(ctx):].argmax(-1).tolist()
        return pred == cont

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-text Monte Carlo log-likelihood (no context)."""
        out = []
        for req in requests:
            (text,) = req.args
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            bos = self.tokenizer.bos_token_id
            ctx = [bos] if bos is not None else []
            out.append(mc_loglikelihood(self.model, ctx, ids, mask_id=self.mask_id, mc_num=self.mc_num,
                                        batch_size=self.mc_batch_size, seed=self.seed))
        return out


def main(argv: list[str] | None = None) -> None:
    """lm-eval's own command line, with the ``dllm`` model registered. The ``dllm`` model's arguments are
    checked first: lm-eval indexes every task it knows before it builds the model (about 15 s)."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = ["lm_eval", *argv]
    if (model_args := _dllm_model_args(sys.argv[1:])) is not None:
        check_model_args(model_args)
    cli_evaluate()


if __name__ == "__main__":
    main()
