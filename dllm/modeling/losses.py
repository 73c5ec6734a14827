"""The masked-diffusion loss a ``forward(input_ids, labels=...)`` call returns (LLaDA's estimator).

For a diffusion LM there is no next-token loss: the model is trained to fill masks. With ``labels`` in
the transformers convention (the target id where it counts, -100 elsewhere, e.g. on the prompt), one
call draws t ~ U(0, 1) per row, masks each labelled position with p = (1 - eps) t + eps, predicts the
masked positions and returns the cross-entropy of the masked tokens divided by p, summed per row and
normalised by the row's labelled-token count, averaged over rows. That is a one-sample Monte Carlo
estimate of the negative ELBO per token (LLaDA, eq. 3), so it is random: two calls on the same batch
give different losses, and its expectation, not one value, is what training lowers. Block-causal
models get the same masking under their block-causal attention (block diffusion's objective).
``dllm train sft`` uses the same estimator with more options (docs/training.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def mask_labelled(input_ids: torch.Tensor, labels: torch.Tensor, mask_id: int, eps: float = 1e-3,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy ids, masked [b, l] bool, p [b, 1]): labelled positions masked i.i.d. with a per-row p."""
    labelled = labels != IGNORE_INDEX
    b = input_ids.shape[0]
    t = torch.rand((b, 1), generator=generator, device="cpu").to(input_ids.device)
    p = (1 - eps) * t + eps
    draw = torch.rand(input_ids.shape, generator=generator, device="cpu").to(input_ids.device)
    masked = (draw < p) & labelled
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, p


def masked_diffusion_loss(logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor,
                          p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the masked labelled tokens / p, per row over its labelled count, mean over rows."""
    targets = torch.where(masked, labels, torch.full_like(labels, IGNORE_INDEX))
    ce = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    per_row = (ce / p).sum(dim=1) / (labels != IGNORE_INDEX).sum(dim=1).clamp(min=1)
    return per_row.mean()
