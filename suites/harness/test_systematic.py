"""fixtures.core.systematic on synthetic outputs: each statistic finds its fault through noise of the size a correct FP8
kernel shows (relative L2 ~0.006 against its recipe), and stays quiet on noise alone. tools/calibrate.py counts the
statistics it judged and the false alarms (none on a correct implementation, some on a 1% scale), drawing every routing
method of reference.routing's table, which the routing-op descriptors implement and name from."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from ci import cli
from fixtures.core import systematic
from fixtures.backends.flashinfer.routing_ops import OPS
from reference import routing
from reference.routing import METHOD_TABLE
from reference.tolerances import PROVISIONAL_SYSTEMATIC as BOUNDS
from tools import calibrate

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
T, K, H, E = 64, 4, 256, 8


def _case(seed: int, noise: float = 0.006):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    terms = torch.randn(T, K, H, generator=gen, dtype=torch.float64)
    ref = terms.sum(1)
    jitter = torch.randn(T, H, generator=gen, dtype=torch.float64) * noise * ref.norm() / (T * H) ** 0.5
    return terms, ids, ref, jitter


def _worst(out, ref, terms, ids):
    found = [(systematic.gain(out, ref), BOUNDS.gain_floor)]
    found += [(e, BOUNDS.expert_gain_floor) for e in systematic.expert_gains(out, terms, ids)]
    return max(found, key=lambda pair: pair[0].excess(BOUNDS.k, pair[1]))


@pytest.mark.parametrize("seed", range(20))
def test_noise_alone_raises_nothing(seed):
    terms, ids, ref, jitter = _case(seed)
    e, floor = _worst(ref + jitter, ref, terms, ids)
    assert e.excess(BOUNDS.k, floor) < 0, f"false alarm on clean noise: {e}"


@pytest.mark.parametrize("seed", range(5))
def test_one_expert_scaled_by_one_percent_is_found_through_the_noise(seed):
    terms, ids, ref, jitter = _case(seed)
    scaled = terms * torch.where(ids == 3, 1.01, 1.0)[:, :, None]
    out = scaled.sum(1) + jitter
    e, floor = _worst(out, ref, terms, ids)
    assert e.what == "expert 3 gain" and e.excess(BOUNDS.k, floor) > 0, str(e)
    assert abs(e.value - 1.01) < 5 * e.se + 1e-4, str(e)


def test_a_uniform_one_in_a_thousand_gain_is_found_through_the_noise():
    terms, ids, ref, jitter = _case(0)
    e = systematic.gain(ref * 1.001 + jitter, ref)
    assert e.excess(BOUNDS.k, BOUNDS.gain_floor) > 0 and abs(e.value - 1.001) < 5 * e.se, str(e)


def test_a_constant_offset_shows_as_bias():
    terms, ids, ref, jitter = _case(1)
    mag = terms.abs().sum(1)
    e = systematic.bias(ref + jitter + 0.01 * mag.mean(), ref, mag)
    assert e.excess(BOUNDS.k, BOUNDS.bias_floor) > 0, str(e)
    assert systematic.bias(ref + jitter, ref, mag).excess(BOUNDS.k, BOUNDS.bias_floor) < 0


def _row_jitter_case(seed: int, jitter: float = 2e-3):
    """A kernel whose rounding moves each token's row as a whole (an FP8 flip in the FC2 input goes through
    W2 to every element of the row): out_t = (1 + eps_t) * ref_t, eps_t ~ N(0, jitter), no systematic gain."""
    terms, ids, ref, _ = _case(seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    eps = torch.randn(T, 1, generator=gen, dtype=torch.float64) * jitter
    return terms, ids, ref, ref * (1 + eps)


def test_row_correlated_noise_raises_nothing():
    """An element-wise standard error (H samples a row) alarms on most clean cases, as on the clean H200 kernels;
    the robust one counts the T tokens and stays quiet on every one."""
    robust = naive = 0
    for seed in range(20):
        terms, ids, ref, out = _row_jitter_case(seed)
        e = systematic.gain(out, ref)
        robust += e.excess(BOUNDS.k, 0.0) > 0
        naive_se = (((out - e.value * ref) ** 2).sum() / (ref.numel() - 1) / (ref**2).sum()).sqrt().item()
        naive += abs(e.value - 1) > BOUNDS.k * naive_se
    assert robust == 0, f"{robust} false alarms of the robust standard error"
    assert naive >= 10, f"the element-wise standard error alarmed on only {naive} of 20: the case is too easy"


def test_a_uniform_gain_is_still_found_through_row_correlated_noise():
    terms, ids, ref, out = _row_jitter_case(0, jitter=2e-4)
    e = systematic.gain(out * 1.001, ref)
    assert e.excess(BOUNDS.k, BOUNDS.gain_floor) > 0, str(e)


def test_few_tokens_are_not_judged():
    terms, ids, ref, jitter = _case(0)
    few = systematic.MIN_TOKENS - 1
    assert systematic.gain(ref[:few] * 1.5, ref[:few]) is None
    assert systematic.bias(ref[:few] + 1.0, ref[:few], ref[:few].abs()) is None
    assert systematic.expert_gains(ref[:few] * 1.5, terms[:few], ids[:few]) == []


def test_an_expert_lost_in_the_rounding_is_not_estimated():
    """A slot at weight e^-8 beside a hot expert: its gain is not measurable through a bf16 output (false H200 alarms);
    it is left out, the hot expert is still judged."""
    terms, ids, _, _ = _case(2)
    small = (ids == 5).any(1, keepdim=True)
    terms = torch.where((ids == 5)[:, :, None], terms * 3e-4, terms)
    ref = terms.sum(1)
    out = ref.to(torch.bfloat16).double()
    found = {e.what: e for e in systematic.expert_gains(out, terms, ids)}
    assert "expert 5 gain" not in found and small.any()
    assert found and all(e.excess(BOUNDS.k, BOUNDS.expert_gain_floor) < 0 for e in found.values()), found


def test_t_multiplier_grows_as_tokens_shrink():
    assert systematic.t_multiplier(6.0, 16) > systematic.t_multiplier(6.0, 64) > 6.0
    assert abs(systematic.t_multiplier(6.0, 100000) - 6.0) < 0.01


def test_an_empty_rank_is_not_judged():
    empty = torch.zeros(0, H, dtype=torch.float64)
    assert systematic.gain(empty, empty) is None and systematic.bias(empty, empty, empty) is None


# ---------------------------------------------------------------- tools/calibrate.py counts the statistics it judged and the false alarms
RECIPE_IMPL = "reference-ep[sm90_pull_fp8_blockwise]"


@pytest.mark.parametrize("fault, alarms", [("", False), ("faulty:scale_1e-2@", True)], ids=["correct", "scale_1e-2"])
def test_no_false_alarm_on_a_correct_implementation_and_some_on_a_one_percent_scale(tmp_path, fault, alarms):
    impl = fault + RECIPE_IMPL
    out = tmp_path / "cal.json"
    assert calibrate.main(["--impl", impl, *"--batches 6 --tokens 64 --models 0 --json".split(), str(out)]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["statistic_checks"] > 0 and (s["false_alarms"] > 0) == alarms, s


def test_an_implementation_that_cannot_run_here_is_refused_with_its_reason(capsys):
    assert calibrate.main(["--impl", "reference-ep", "--ep", "3"]) == cli.NOTHING_TESTED
    assert "does not support EP3" in capsys.readouterr().out


def _drawn(top_k: int) -> set[str]:
    rng = random.Random(0)
    return {calibrate.draw_method(rng, top_k) for _ in range(400)}


def test_calibration_draws_every_routing_method_of_the_table():
    """The tolerances are calibrated on every method the suite holds to them: none left out of the draw."""
    assert _drawn(1) | _drawn(4) == set(routing.METHOD_TABLE)


def test_a_method_added_to_the_table_is_drawn_for_calibration(monkeypatch):
    new = routing.Method("NewMethod", lambda z, b: z, lambda z, s, ids: s.gather(1, ids))
    monkeypatch.setitem(routing.METHOD_TABLE, "NewMethod", new)
    assert "NewMethod" in _drawn(4)


# ---------------------------------------------------------------- the routing-op descriptors name the table's methods
def test_every_method_of_the_table_is_some_ops_method():
    covered = {m for op in OPS for m in op.methods}
    assert set(METHOD_TABLE) <= covered, f"no routing op implements {sorted(set(METHOD_TABLE) - covered)}"


def test_an_op_naming_a_method_the_table_lacks_is_refused():
    with pytest.raises(ValueError, match=r"\['DeepSeekV4'\] not in reference.routing.METHOD_TABLE"):
        dataclasses.replace(OPS[0], methods=("DeepSeekV3", "DeepSeekV4"))
