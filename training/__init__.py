"""Training: masked-diffusion SFT, D2F distillation and TPF-aware GRPO on a shared engine (see
``dllm.training.engine``). From Python, like trl::

    from dllm.training import SFTConfig, SFTTrainer
    SFTTrainer(model="tiny", args=SFTConfig(max_steps=100), train_dataset=rows).train()
"""

from .config import ConfigError, DistillConfig, SFTConfig, TrainConfig, load_config
from .engine import RunDirInUse, RunResult, Trainer, TrainingDiverged

__all__ = [
    "ConfigError", "DistillConfig", "DistillTrainer", "GRPOConfig", "GRPOTrainer", "RunDirInUse", "RunResult",
    "SFTConfig", "SFTTrainer", "TrainConfig", "Trainer", "TrainingDiverged", "load_config",
]


def __getattr__(name):  # trainers import peft/accelerate lazily
    if name == "SFTTrainer":
        from .sft import SFTTrainer

        return SFTTrainer
    if name == "DistillTrainer":
        from .distill import DistillTrainer

        return DistillTrainer
    if name == "GRPOConfig":
        from .grpo_config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from .grpo import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(name)
