"""training/precision.py: a run warns when bf16 autocast would be emulated on its CPU."""

from dllm.training.precision import cpu_bf16_is_native, slow_precision_warning

AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
BF16 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 avx512f avx512_bf16\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\n"


def test_cpu_flags_are_read():
    assert cpu_bf16_is_native(AVX2) is False
    assert cpu_bf16_is_native(BF16) is True
    assert cpu_bf16_is_native(BF16.replace("avx512_bf16", "amx_bf16")) is True
    assert cpu_bf16_is_native(ARM) is None  # not an x86 flags list: no verdict
    assert cpu_bf16_is_native("") is None


def test_warning_only_for_emulated_bf16_on_cpu():
    msg = slow_precision_warning("bf16", "cpu", AVX2)
    assert msg is not None and "mixed_precision=no" in msg
    assert slow_precision_warning("bf16", "cpu", BF16) is None
    assert slow_precision_warning("no", "cpu", AVX2) is None
    assert slow_precision_warning("bf16", "cpu", ARM) is None
    assert slow_precision_warning("bf16", "cuda", AVX2) is None  # GPUs have their own bf16 units


def test_the_trainer_prints_it(tmp_path, monkeypatch, capsys):
    import dllm.training.engine as engine
    from dllm.training.config import SFTConfig, load_config
    from dllm.training.sft import SFTTrainer

    from .conftest import micro_overrides

    seen = []
    monkeypatch.setattr(engine, "slow_precision_warning",
                        lambda mp, device: seen.append((mp, str(device))) or f"slow {mp} here")
    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=1))
    SFTTrainer(cfg).run()
    assert seen == [("no", "cpu")] and "[dllm.train] slow no here" in capsys.readouterr().err
