# Run: .venv/bin/python -m pytest tests/test_bench_weights.py -x -q
"""bench/learning/weights.py: its groups cover every tensor of the committed lookup model once,
a hybrid takes exactly the named tensors, the change is measured on them, and its probes are
paired: a hybrid whose weights equal the base's draws the base's samples (the real probe, the
real mini-swe-agent CLI capture)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.learning import weights
from launchers.warm_models import committed_lookup_model

GROUPS = {"embeddings", "norms", "layer 0 attention", "layer 0 mlp", "layer 1 attention",
          "layer 1 mlp"}


@pytest.fixture(scope="module")
def base():
    return AutoModelForCausalLM.from_pretrained(committed_lookup_model(), dtype=torch.float32)


def _perturbed(model, group: str, scale: float = 1.1):
    """A copy of `model` with every tensor of `group` multiplied by `scale`."""
    names = weights.groups(model)[group]
    out = weights.with_tensors(model, model, [])
    with torch.no_grad():
        for name, param in out.named_parameters():
            if name in names:
                param.mul_(scale)
    return out


def test_every_tensor_is_in_exactly_one_group(base):
    by_group = weights.groups(base)
    assert set(by_group) == GROUPS
    listed = [n for names in by_group.values() for n in names]
    assert sorted(listed) == sorted(n for n, _ in base.named_parameters())
    assert len(listed) == len(set(listed))
    assert "model.layers.0.self_attn.v_proj.weight" in by_group["layer 0 attention"]
    assert by_group["embeddings"] == ["model.embed_tokens.weight"]  # the head is tied to it


def test_an_unknown_parameter_name_is_refused_by_name():
    with pytest.raises(ValueError, match="transformer.h.0.attn.c_attn.weight"):
        weights.tensor_group("transformer.h.0.attn.c_attn.weight")


def test_a_hybrid_takes_the_named_tensors_alone_and_changes_neither_model(base):
    run = _perturbed(base, "layer 0 attention")
    names = weights.groups(base)["layer 0 attention"]
    hybrid = weights.with_tensors(base, run, names)
    b, r, h = (dict(m.named_parameters()) for m in (base, run, hybrid))
    for name in b:
        expected = r[name] if name in names else b[name]
        assert torch.equal(h[name], expected), name
    assert not torch.equal(b[names[0]], r[names[0]])  # the inputs kept their own weights


def test_the_change_is_measured_on_the_group_it_names(base):
    run = _perturbed(base, "layer 1 mlp", scale=1.1)
    by_group = weights.groups(base)
    assert weights.relative_change(base, run, by_group["layer 1 mlp"]) == pytest.approx(0.1)
    for group in GROUPS - {"layer 1 mlp"}:
        assert weights.relative_change(base, run, by_group[group]) == 0.0


def test_a_folder_without_a_model_is_refused_with_what_it_needs(tmp_path):
    with pytest.raises(SystemExit, match="trainer/model"):
        weights.model_dir(tmp_path)


def test_a_run_of_another_model_is_refused_before_anything_is_probed(base, tmp_path):
    config = base.config.to_dict()
    config["intermediate_size"] = 96
    other = AutoModelForCausalLM.from_config(type(base.config).from_dict(config))
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(SystemExit, match="give --base the model the run started from"):
        weights.ablate(committed_lookup_model(), [tmp_path / "other"], samples=1)


@pytest.mark.slow
def test_hybrids_with_the_bases_weights_draw_the_bases_samples(base, tmp_path):
    # A run that lost layer 0's attention only (zeroed: the copy and the file name's read are
    # gone, so its probe differs from the base's and the checks below can fail): putting that
    # group back, or taking any other group from the run, gives the base's weights, so the
    # paired probe must give the base's rates exactly.
    run = _perturbed(base, "layer 0 attention", scale=0.0)
    run.save_pretrained(tmp_path / "run")
    report = weights.ablate(committed_lookup_model(), [tmp_path / "run"], samples=1)
    data = report[str(tmp_path / "run")]
    assert set(data["groups"]) == GROUPS
    assert data["run"] != data["base"]
    assert data["groups"]["layer 0 attention"]["change"] == pytest.approx(1.0)
    assert data["groups"]["layer 0 attention"]["put_back"] == data["base"]
    for group in GROUPS - {"layer 0 attention"}:
        assert data["groups"][group]["change"] == 0.0
        assert data["groups"][group]["taken_alone"] == data["base"]
        assert data["groups"][group]["put_back"] == data["run"]
    assert data["base"]["n"] == 12  # every dev instruction, one sample each


def test_changes_only_measures_the_whole_model_and_each_group_without_probing(base, tmp_path):
    # Two groups scaled: the whole model's change is over both together, each group's its own,
    # and the rest read 0; nothing is probed (no capture, no agent), so it runs in seconds.
    run = _perturbed(_perturbed(base, "layer 1 mlp", scale=1.1), "norms", scale=1.2)
    run.save_pretrained(tmp_path / "run" / "trainer" / "model")
    moved = weights.changes(committed_lookup_model(), [tmp_path / "run"])[str(tmp_path / "run")]
    by_group = weights.groups(base)
    assert set(moved) == GROUPS | {"all"}
    assert moved["layer 1 mlp"] == pytest.approx(0.1)
    assert moved["norms"] == pytest.approx(0.2)
    for group in GROUPS - {"layer 1 mlp", "norms"}:
        assert moved[group] == 0.0
    params = dict(base.named_parameters())
    sq = lambda names: sum(float((params[n] ** 2).sum()) for n in names)  # noqa: E731
    whole = sq(n for names in by_group.values() for n in names)
    expected = ((0.01 * sq(by_group["layer 1 mlp"]) + 0.04 * sq(by_group["norms"])) / whole) ** 0.5
    assert moved["all"] == pytest.approx(expected, rel=1e-4)
    assert 0 < moved["all"] < 0.2


def test_changes_only_prints_every_group_uncut_at_80_columns_and_writes_its_report(
        base, tmp_path, capsys):
    run = _perturbed(base, "layer 0 mlp", scale=1.5)
    for name in ("real-0", "shuffle-1", "shuffle-3"):
        run.save_pretrained(tmp_path / "runs" / name / "trainer" / "model")
    folders = [str(tmp_path / "runs" / name) for name in ("real-0", "shuffle-1", "shuffle-3")]
    assert weights.main([*folders, "--changes-only", "--out", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 80
    words = printed.split()
    for word in ("embeddings", "attention", "mlp", "norms", "whole", "model", "0.5000"):
        assert word in words, word  # folded onto its own line, never cut to "embedd…"
    assert "…" not in printed
    report = json.loads((tmp_path / "r.json").read_text())
    assert list(report) == folders
    assert report[folders[0]]["layer 0 mlp"] == pytest.approx(0.5)
