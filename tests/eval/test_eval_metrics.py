"""Hand-computed values for TPF, AUP, latency percentiles and accuracy."""
import math

import pytest

from dllm.eval.metrics import accuracy, aup, aup_weight, count_generated_tokens, latency_percentiles, percentile, tpf
from dllm.eval.tasks import Score


def test_count_generated_tokens():
    assert count_generated_tokens([5, 6, 2, 2, 2], eos_id=2) == 3  # up to and including first EOS
    assert count_generated_tokens([5, 6, 7], eos_id=2) == 3  # no EOS: everything
    assert count_generated_tokens([5, 6, 0, 0], eos_id=2, pad_id=0) == 2  # stops before padding
    assert count_generated_tokens([5, 2, 0, 0], eos_id=2, pad_id=0) == 2
    assert count_generated_tokens([5, 2, 2], eos_id=2, pad_id=2) == 2  # pad == eos
    assert count_generated_tokens([2], eos_id=2) == 1
    assert count_generated_tokens([], eos_id=2) == 0
    np = pytest.importorskip("numpy")
    assert count_generated_tokens(np.array([4, 4, 9, 9]), eos_id=9) == 3
    with pytest.raises(ValueError):
        count_generated_tokens([[1, 2], [3, 4]], eos_id=2)


def test_count_generated_tokens_torch():
    torch = pytest.importorskip("torch")
    assert count_generated_tokens(torch.tensor([4, 4, 4, 9, 9]), eos_id=9) == 4


def test_tpf():
    assert tpf(10, 4) == 2.5
    assert tpf([10, 20], [5, 5]) == 3.0
    # ratio of sums (14 / 7 = 2.0), not the mean of per-sample ratios ((6 + 0.4) / 2 = 3.2)
    assert tpf([12, 2], [2, 5]) == 2.0
    with pytest.raises(ValueError):
        tpf(5, 0)
    with pytest.raises(ValueError):
        tpf(-1, 3)


def test_aup_d3llm_example():
    # d3LLM-LLaDA GSM8K: (1, 74.02) and (9.11, 73.09); pool y_max 74.98 -> 637.7, y_max 90.3 -> 416.1
    assert abs(aup([(1, 74.02), (9.11, 73.09)], y_max=74.98) - 637.7) < 0.5
    assert abs(aup([(9.11, 73.09), (1, 74.02)], y_max=90.3) - 416.1) < 0.5  # order does not matter


def test_aup_hand_computed():
    # One point: AUP = rho_1 * y_1 (an AR model at TPF 1 scores its accuracy).
    assert aup([(1.0, 80.0)]) == 80.0
    assert aup([(2.5, 60.0)]) == 150.0
    # (2, 40), (4, 38), y_max 40:  2*40 + 0.5*(4-2)*(40*W(40) + 38*W(38));
    # W(40) = 1, W(38) = exp(-3*(1 - 38/40)) = exp(-0.15) = 0.860708; 38*0.860708 = 32.706904
    # -> 80 + 72.706904 = 152.706904
    assert aup([(2, 40), (4, 38)], y_max=40) == pytest.approx(152.706904, abs=1e-5)
    # Points above y_max get weight 1: (1, 50), (3, 52), y_max 50 -> 50 + 0.5*2*(52 + 50) = 152
    assert aup([(1, 50), (3, 52)], y_max=50) == pytest.approx(152.0)
    # Default y_max = best accuracy among the points: (1, 50), (3, 50) -> 50 + 0.5*2*(50 + 50) = 150
    assert aup([(1, 50), (3, 50)]) == pytest.approx(150.0)
    # Points below y_1 - 5 are dropped: (1, 80), (2, 70), (3, 78), y_max 80 -> (2, 70) is dropped;
    # 80 + 0.5*(3-1)*(80 + 78*exp(-3*(1 - 78/80))) = 80 + 80 + 78*exp(-0.075) = 160 + 72.363994
    assert aup([(1, 80), (2, 70), (3, 78)], y_max=80) == pytest.approx(232.363994, abs=1e-5)
    assert aup_weight(78, 80) == pytest.approx(math.exp(-0.075))


def test_aup_errors():
    with pytest.raises(ValueError, match="drops by"):
        aup([(1, 80), (2, 74)])  # fastest point lost 6 > 5 points
    assert aup([(1, 80), (2, 74)], strict=False) == 80.0  # lenient: that point is dropped
    with pytest.raises(ValueError):
        aup([])
    with pytest.raises(ValueError):
        aup([(0, 50)])


def test_latency_percentiles():
    # sorted [1, 2, 3, 4]: p50 rank 0.5*3 = 1.5 -> 2 + 0.5*(3-2) = 2.5; p95 rank 2.85 -> 3 + 0.85*(4-3) = 3.85
    assert latency_percentiles([4.0, 1.0, 3.0, 2.0]) == pytest.approx({"p50": 2.5, "p95": 3.85})
    assert latency_percentiles([0.7]) == {"p50": 0.7, "p95": 0.7}
    assert percentile([10, 20, 30], 0) == 10 and percentile([10, 20, 30], 100) == 30
    with pytest.raises(ValueError):
        latency_percentiles([])
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_accuracy():
    scores = [Score(True, 1.0, {}), Score(False, 0.1, {}), Score(True, 1.0, {}), Score(False, 0.0, {})]
    assert accuracy(scores) == 0.5
    assert accuracy([True, True, False]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        accuracy([])
