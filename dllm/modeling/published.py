"""Config classes that write a checkpoint family's ``config.json`` in its published layout.

The SDAR and Fast-dLLM v2 checkpoints were saved by transformers 4.5x. transformers 5 renames or
drops some of their keys when it serialises a config (``rope_scaling`` becomes ``rope_parameters``,
``torch_dtype`` becomes ``dtype``, ``use_cache`` and ``attn_implementation`` disappear), so a model
trained here and saved with ``save_pretrained`` would no longer be loadable by the family's own
code or by the engines that serve it. :class:`PublishedLayoutConfig` puts those keys back as the
published files spell them, and leaves out dllm's own optional keys while they hold the family's
defaults (``OURS``), so a saved folder has exactly the published keys.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from .configuration import CheckpointConfigError


class PublishedLayoutConfig(PretrainedConfig):
    #: dllm's own keys and the values at which they are left out of config.json
    OURS = {}  # noqa: RUF012 - a class constant (unannotated: transformers turns annotated attributes into fields)
    #: save_pretrained copies the loaded folder's generation_config.json (dllm.generation.mixin)
    KEEPS_PUBLISHED_FILES = True

    def _keep_published(self, *, rope_scaling, use_cache, kwargs: dict) -> None:
        """Call before ``PretrainedConfig.__init__``: remember the keys transformers 5 rewrites."""
        self.published_rope_scaling = rope_scaling
        self.published_use_cache = use_cache
        # SDAR's files say "flex_attention": handed to transformers it would pick an attention
        # implementation for a model that has its own (dllm.modeling.attention_backends)
        self.published_attn_implementation = kwargs.pop("attn_implementation", None)
        self.use_cache = use_cache

    # ``to_dict`` writes the published ``torch_dtype`` key, and transformers reads every key of it back as an
    # attribute (``to_diff_dict``, behind each repr of the config, which every from_pretrained logs): its
    # own ``torch_dtype`` property warns that the name is deprecated, on each load of a published folder.
    @property
    def torch_dtype(self):
        return self.dtype

    @torch_dtype.setter
    def torch_dtype(self, value) -> None:
        self.dtype = value

    def unsupported_rope(self) -> None:
        rs = self.published_rope_scaling
        if rs and rs.get("rope_type", rs.get("type")) not in (None, "default"):
            raise CheckpointConfigError(f"{type(self).__name__} has rope_scaling={rs}, which dllm does not implement")

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.pop("rope_parameters", None)
        out["rope_scaling"] = out.pop("published_rope_scaling", None)
        out["use_cache"] = out.pop("published_use_cache", self.use_cache)
        attn = out.pop("published_attn_implementation", None)
        out.pop("attn_implementation", None)
        if attn is not None:
            out["attn_implementation"] = attn
        if "dtype" in out:
            out["torch_dtype"] = out.pop("dtype")
        for key, default in self.OURS.items():
            if key in out and out[key] == default:
                del out[key]
        return out
