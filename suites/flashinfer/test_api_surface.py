"""FlashInfer's public MegaMoE surface, pinned on CPU: an upgrade shows up as a readable diff.

The pinned snapshot (fixtures/backends/flashinfer/api-<version>.json) is written by
``python -m tools.snapshot_flashinfer_api --write``; behaviours docs/flashinfer-kernels.md documents are asserted here
by hand, independently of the snapshot.
"""

from __future__ import annotations

import json

import pytest
import torch

from ci import api_diff
from tools.snapshot_flashinfer_api import snapshot, snapshot_path
from fixtures.core import findings
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS

pytestmark = [pytest.mark.api, pytest.mark.cpu]


def surface_failure(live: dict, directory=None) -> str | None:
    """None when the installed surface equals its pin; else what a reviewer needs: the readable diff
    against its own pin or, for an unpinned version, against the nearest pinned one."""
    version = live["flashinfer_version"]
    kw = {} if directory is None else {"directory": directory}
    path = (directory / f"api-{version}.json") if directory else snapshot_path(version)
    if path.exists():
        lines = api_diff.diff(json.loads(path.read_text()), live)
        return (
            ("FlashInfer's MegaMoE API differs from its pin " + str(path) + ":\n" + "\n".join(lines[:200]))
            if lines
            else None
        )
    near = api_diff.nearest_pinned(version, **kw)
    if near is None:
        return "no pinned API snapshot at all; run `python -m tools.snapshot_flashinfer_api --write`"
    pinned = (directory / f"api-{near}.json") if directory else snapshot_path(near)
    lines = api_diff.diff(json.loads(pinned.read_text()), live)
    return (
        f"no pinned API snapshot for flashinfer-python {version}; against the nearest pin, {near}, "
        f"{len(lines)} difference(s) (review, then `python -m tools.snapshot_flashinfer_api --write`):\n"
        + "\n".join(lines[:200])
    )


def test_public_surface_matches_the_pinned_snapshot():
    failure = surface_failure(snapshot())
    if failure:
        pytest.fail(failure)


def test_an_unpinned_version_is_shown_as_a_diff_against_the_nearest_pin(tmp_path):
    """A synthetic 0.9.0 (one kernel added, one config default changed, one export gone, one field added)
    against a directory holding only the 0.7.2.post1 pin: every change is named, section by section."""
    pinned = json.loads(snapshot_path("0.7.2.post1").read_text())
    (tmp_path / "api-0.7.2.post1.json").write_text(json.dumps(pinned))
    live = json.loads(json.dumps(pinned))
    live["flashinfer_version"] = "0.9.0"
    live["mega_kernels"].append("sm90_fake_new_kernel")
    live["exports"].remove("MoEEpLayer")
    config = live["kernel_configs"]["Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig"]
    config["fields"] = [[n, "2xacc" if n == "fp8_accum_mode" else d, i] for n, d, i in config["fields"]]
    config["fields"].append(["new_knob", 3, True])
    text = surface_failure(live, directory=tmp_path)
    assert "no pinned API snapshot for flashinfer-python 0.9.0; against the nearest pin, 0.7.2.post1" in text
    for line in (
        "kernel added: sm90_fake_new_kernel",
        "export removed: MoEEpLayer",
        "Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig: default changed: fp8_accum_mode: '1xacc' -> '2xacc'",
        "Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig: field added: new_knob (default 3)",
    ):
        assert line in text, text
    assert surface_failure(pinned, directory=tmp_path) is None  # a pinned, unchanged surface passes


def test_a_changed_megamoe_surface_is_named(tmp_path):
    """flashinfer.megamoe's part of the pin (issue 26 item 6): an export dropped, a signature and a plan field
    changed, the family threshold moved, each a line of the diff."""
    pinned = json.loads(snapshot_path("0.7.4").read_text())
    live = json.loads(json.dumps(pinned))
    mm = live["megamoe"]
    mm["exports"].remove("select_split_plan")
    mm["signatures"]["mxfp4_mega_moe"] += " # changed"
    mm["plan_fields"]["FusedPlan"].append("new_field")
    mm["constants"]["FAMILY_THRESHOLD"] = 512
    lines = api_diff.diff(pinned, live)
    for line in (
        "megamoe export removed: select_split_plan",
        "megamoe signature changed: mxfp4_mega_moe",
        "megamoe plan fields changed: FusedPlan",
        "megamoe constant changed: FAMILY_THRESHOLD: 256 -> 512",
    ):
        assert any(x.startswith(line) for x in lines), (line, lines)
    assert api_diff.diff(pinned, pinned) == []


def test_pull_config_defaults_match_the_catalogue():
    import dataclasses

    import flashinfer.moe_ep as fi

    defaults = {f.name: f.default for f in dataclasses.fields(fi.Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig)}
    # kernels §3.1 item 4
    assert defaults["kind"] == "fp8_e4m3" and defaults["fp8_scale_mode"] == "per_tensor"
    assert defaults["fp8_accum_mode"] == "1xacc" and defaults["active_dispatch_warps"] == 1
    assert defaults["compact_pull_buffer"] is True and defaults["dedup_dispatch"] is False
    assert defaults["fc1_activation_dequant_scale"] == 1.0 and defaults["fc2_activation_dequant_scale"] == 1.0


def test_error_classes():
    import flashinfer.moe_ep as fi

    assert issubclass(fi.MoEEpConfigError, ValueError)
    assert issubclass(fi.MoEEpArchError, fi.MoEEpConfigError)


def test_weight_pack_factory():
    import flashinfer.moe_ep as fi

    w13, w2 = torch.zeros(2, 8, 4), torch.zeros(2, 4, 4)
    assert isinstance(fi.MoEWeightPack(w13, w2), fi.UnquantizedMoEWeights)
    scales = torch.ones(2, 1, 1)
    assert isinstance(fi.MoEWeightPack(w13, w2, w13_scale=scales, w2_scale=scales), fi.PrequantizedMoEWeights)
    with pytest.raises(ValueError):
        fi.MoEWeightPack(w13, w2, w13_scale=scales)
    with pytest.raises(TypeError):
        fi.MoEWeightPack(w13=None, w2=w2)


@pytest.mark.parametrize(
    "hidden, inter, match",
    [
        (200, 256, "multiple of"),  # H misaligned
        (256, 200, "multiple of"),  # I misaligned
    ],
)
def test_fleet_validation_rejects_misaligned_geometry(hidden, inter, match):
    import flashinfer.moe_ep as fi

    fleet = fi.FleetParams(num_experts=8, max_tokens_per_rank=16, token_hidden_size=hidden)
    with pytest.raises(fi.MoEEpConfigError, match=match):
        fi.validate_mega_fleet_params(fleet, 1, intermediate_size=inter, top_k=2)


def test_fleet_validation_rejects_experts_not_divisible_by_world():
    import flashinfer.moe_ep as fi

    fleet = fi.FleetParams(num_experts=6, max_tokens_per_rank=16, token_hidden_size=256)
    with pytest.raises(fi.MoEEpConfigError):
        fi.validate_mega_fleet_params(fleet, 4, intermediate_size=256, top_k=2)


@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=findings.text("F4"))
def test_fleet_validation_rejects_top_k_above_expert_count():
    import flashinfer.moe_ep as fi

    fleet = fi.FleetParams(num_experts=4, max_tokens_per_rank=16, token_hidden_size=256)
    with pytest.raises(fi.MoEEpConfigError):
        fi.validate_mega_fleet_params(fleet, 1, intermediate_size=256, top_k=8)


def test_forward_input_validation():
    import flashinfer.moe_ep as fi

    fleet = fi.FleetParams(num_experts=8, max_tokens_per_rank=4, token_hidden_size=256)
    x, ids, w = torch.zeros(5, 256), torch.zeros(5, 2, dtype=torch.long), torch.zeros(5, 2)
    with pytest.raises(fi.MoEEpConfigError):  # T above capacity
        fi.validate_mega_forward_inputs(x, ids, w, fleet, top_k=2, quantize_input=True)
    with pytest.raises(fi.MoEEpConfigError):  # ids shape != (T, top_k)
        fi.validate_mega_forward_inputs(x[:4], ids[:4, :1], w[:4], fleet, top_k=2, quantize_input=True)


@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=findings.text("F9"))
@pytest.mark.parametrize("bad_id", [8, -2], ids=["id=E", "id=-2"])
def test_forward_input_validation_rejects_out_of_range_ids(bad_id):
    import flashinfer.moe_ep as fi

    fleet = fi.FleetParams(num_experts=8, max_tokens_per_rank=4, token_hidden_size=256)
    ids = torch.tensor([[0, bad_id]])
    with pytest.raises(fi.MoEEpConfigError):
        fi.validate_mega_forward_inputs(torch.zeros(1, 256), ids, torch.ones(1, 2), fleet, top_k=2, quantize_input=True)


def test_bare_kernel_config_is_refused_by_the_layer_factory():
    import flashinfer.moe_ep as fi

    config = fi.Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig(intermediate_size=128, top_k=2)
    with pytest.raises(TypeError, match="MegaConfig"):
        fi.MoEEpLayer(
            fi.BootstrapConfig(1, 0, auto_bootstrap=False),
            fi.FleetParams(8, 16, 256),
            fi.MoEWeightPack(
                torch.zeros(8, 256, 256, dtype=torch.bfloat16), torch.zeros(8, 256, 128, dtype=torch.bfloat16)
            ),
            backend=config,
        )


@pytest.mark.parametrize(
    "descriptor",
    [descriptor for descriptor in DESCRIPTORS if not descriptor.variant or descriptor.variant == "blockwise"],
    ids=lambda descriptor: descriptor.kernel_name,
)
def test_layer_constructs_on_cpu_without_preprocessing(descriptor):
    """kernels §8: with preprocess_weights=False, 14 of 15 layers construct on CPU (rank-major needs W=8)."""
    import flashinfer.moe_ep as fi

    if not descriptor.cpu_constructible:
        pytest.skip(
            f"{descriptor.impl_name} needs a live GPU even to construct its layer (descriptor: {descriptor.source})"
        )
    cfg = getattr(fi, descriptor.config_class)
    inter, hidden = max(128, descriptor.intermediate_multiple), max(256, descriptor.hidden_multiple)
    kwargs = (
        {}
        if descriptor.exact_world_size
        else {"intermediate_size": inter, "top_k": min(descriptor.top_k_values, key=lambda k: abs(k - 2))}
    )
    pack = fi.MoEWeightPack(
        torch.zeros(8, 2 * inter, hidden, dtype=torch.bfloat16), torch.zeros(8, hidden, inter, dtype=torch.bfloat16)
    )
    backend = fi.MegaConfig(megakernel=cfg(**kwargs), preprocess_weights=False)
    boot = fi.BootstrapConfig(1, 0, auto_bootstrap=False)
    if descriptor.exact_world_size:
        with pytest.raises(fi.MoEEpConfigError, match=rf"world[_ ]size[= ]{descriptor.exact_world_size}"):
            fi.MoEEpLayer(boot, fi.FleetParams(8, 16, hidden), pack, backend=backend)
        return
    if descriptor.min_world_size > 1:  # one rank is refused, saying the range
        with pytest.raises(Exception, match=rf"world size 1 outside {descriptor.min_world_size}\.\."):
            fi.MoEEpLayer(boot, fi.FleetParams(8, 16, hidden), pack, backend=backend)
        return
    layer = fi.MoEEpLayer(boot, fi.FleetParams(8, 16, hidden), pack, backend=backend)
    assert isinstance(layer, fi.MoEEpMegaLayer)
    layer.destroy()
