"""Training: masked-diffusion SFT and D2F distillation on a shared engine (see ``dllm.training.engine``)."""

from .config import ConfigError, DistillConfig, SFTConfig, TrainConfig, load_config
from .engine import RunDirInUse, RunResult, Trainer, TrainingDiverged

__all__ = [
    "ConfigError", "DistillConfig", "DistillTrainer", "RunDirInUse", "RunResult", "SFTConfig", "SFTTrainer",
    "TrainConfig", "Trainer", "TrainingDiverged", "load_config",
]


def __getattr__(name):  # trainers import peft/accelerate lazily
    if name == "SFTTrainer":
        from .sft import SFTTrainer

        return SFTTrainer
    if name == "DistillTrainer":
        from .distill import DistillTrainer

        return DistillTrainer
    raise AttributeError(name)
