"""Memory: chunked log-probs equal the dense ones (values and gradients), checkpointing
changes no gradient, and the memory calculator agrees with what a CPU run measures.

Run: .venv/bin/python -m pytest tests/test_trainer_memory.py -q
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.trainer import make_trainer, random_microbatch, small_qwen3
from trainer.forward import microbatch_logprobs
from trainer.loss import chunked_token_logprobs, token_logprobs
from trainer.memory import (
    QWEN3,
    ModelShape,
    estimate,
    fixed_activation_bytes,
    layer_activation_bytes,
    main,
)
from trainer.model_init import enable_gradient_checkpointing

REPO = Path(__file__).resolve().parents[1]


def _grads(model, mb, chunk: int, weights: torch.Tensor):
    model.zero_grad(set_to_none=True)
    model.train()
    logp, entropy = microbatch_logprobs(model, mb, 0.7, logits_chunk=chunk)
    (logp * weights).sum().backward()
    return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}


# --- chunked log-probs -----------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_logprobs_equal_dense_ones_with_their_gradients(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(50, 32, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(32, 300, bias=False).double()
    targets = torch.randint(0, 300, (50,))
    up = torch.randn(50, dtype=torch.float64)  # an arbitrary upstream gradient
    logp, ent = chunked_token_logprobs(hidden, head, targets, 0.7, chunk=chunk)
    (logp * up).sum().backward()
    gh, gw = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    ref, ref_ent = token_logprobs(head(hidden), targets, 0.7)
    (ref * up).sum().backward()
    # float64 in, but the softmax runs in fp32 as in the dense path: equal to fp32 rounding
    assert torch.allclose(logp.double(), ref.double(), atol=1e-5)
    assert torch.allclose(ent.double(), ref_ent.double(), atol=1e-5)
    assert torch.allclose(gh, hidden.grad, atol=1e-5)
    assert torch.allclose(gw, head.weight.grad, atol=1e-5)


def test_the_model_path_with_chunks_gives_the_dense_paths_logprobs_and_gradients():
    model = small_qwen3()
    mb = random_microbatch(96, 1000)
    w = torch.randn(95, generator=torch.Generator().manual_seed(1))
    dense_lp, dense_ent, dense = _grads(model, mb, 0, w)
    lp, ent, chunked = _grads(model, mb, 16, w)
    assert torch.allclose(lp, dense_lp, atol=1e-5) and torch.allclose(ent, dense_ent, atol=1e-5)
    for name, g in dense.items():  # includes the tied embedding / lm_head
        assert torch.allclose(chunked[name], g, atol=1e-5), name


def test_chunks_refuse_a_bad_size_and_a_biased_head():
    h, t = torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk=0"):
        chunked_token_logprobs(h, torch.nn.Linear(8, 10, bias=False), t, 1.0, chunk=0)
    with pytest.raises(ValueError, match="bias"):
        chunked_token_logprobs(h, torch.nn.Linear(8, 10), t, 1.0)


# --- activation checkpointing ----------------------------------------------------------------------
def test_checkpointing_each_layer_gives_the_same_gradients():
    model = small_qwen3(layers=3)
    mb = random_microbatch(64, 1000)
    w = torch.randn(63, generator=torch.Generator().manual_seed(2))
    _, _, plain = _grads(model, mb, 16, w)
    on, why = enable_gradient_checkpointing(model, True, torch.device("cpu"))
    assert on and "on" in why
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    _, _, ckpt = _grads(model, mb, 16, w)
    for name, g in plain.items():
        assert torch.allclose(ckpt[name], g, atol=1e-6), name


def test_checkpointing_auto_is_on_for_cuda_and_off_for_cpu():
    model = small_qwen3(layers=1)
    assert enable_gradient_checkpointing(model, "auto", torch.device("cpu"))[0] is False
    assert not model.model.layers[0].gradient_checkpointing
    assert enable_gradient_checkpointing(model, "auto", torch.device("cuda", 0))[0] is True


def test_the_config_refuses_a_bad_checkpointing_or_chunk_setting():
    from trainer.config import AsyncGRPOConfig

    problems = AsyncGRPOConfig(gradient_checkpointing="yes", logits_chunk_tokens=-1).validate()
    assert any(p.startswith("gradient_checkpointing='yes'") for p in problems)
    assert any(p.startswith("logits_chunk_tokens=-1") for p in problems)


# --- the calculator against measurements -----------------------------------------------------------
def _saved_bytes(model, n: int) -> int:
    """Bytes autograd saves in the decoder's forward (storages counted once, parameters not)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize(("dtype", "b"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_saved_activations_per_layer_match_the_calculator(dtype, b):
    # The difference between a 4- and a 2-layer model is 2 layers' worth, whatever is outside.
    n = 256
    two, four = (_saved_bytes(small_qwen3(layers=k).to(dtype).train(), n) for k in (2, 4))
    measured = (four - two) / 2 / n  # bytes per token per layer
    shape = ModelShape.from_config(small_qwen3(layers=1).config)
    predicted = layer_activation_bytes(shape, b)
    # measured 12336 (fp32) and 7088 (bf16) against 12560 and 7184
    assert measured == pytest.approx(predicted, rel=0.03), (measured, predicted)
    outside = (two - 2 * n * measured) / n
    assert outside == pytest.approx(fixed_activation_bytes(shape, b), rel=0.1, abs=256)


PEAK_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, {repo!r})
from tests.helpers.trainer import random_microbatch, small_qwen3
from trainer.forward import microbatch_logprobs
from trainer.model_init import enable_gradient_checkpointing
torch.set_num_threads(1)
model = small_qwen3(layers=4, vocab=2000, hidden=256, inter=768)
enable_gradient_checkpointing(model, {ckpt!r}, torch.device("cpu"))
mb = random_microbatch({n}, 2000)
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
def step():
    model.train()
    logp, _ = microbatch_logprobs(model, mb, 1.0, logits_chunk={chunk})
    logp.sum().backward()
step()  # warm-up: thread pools, lazy imports
model.zero_grad(set_to_none=True)
open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current RSS
base = rss("VmRSS")
step()
print(json.dumps({{"peak": rss("VmHWM") - base}}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("ckpt", [False, True], ids=["ckpt-off", "ckpt-on"])
def test_the_peak_of_a_forward_and_backward_matches_the_calculator(tmp_path, ckpt):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak RSS")
    n, chunk = 2048, 512
    script = tmp_path / "peak.py"
    script.write_text(PEAK_SCRIPT.format(repo=str(REPO), ckpt=ckpt,
                                         n=n, chunk=chunk))
    # A fixed mmap threshold: glibc then returns every large block to the OS when it is freed,
    # so the resident peak follows the live tensors (its dynamic threshold keeps freed blocks).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    shape = ModelShape.from_config(small_qwen3(layers=4, vocab=2000, hidden=256,
                                                inter=768).config)
    e = estimate(shape, world=1, tokens=n, checkpointing=ckpt, b=4, logits_chunk=chunk)
    # One process: parameters and AdamW state exist before the measured step, nothing is
    # gathered, and at the peak (the first layers of the backward) only the root's and one
    # layer's gradients exist yet.
    step_bytes = e["total"] - e["parameters"] - e["gradients"] - e["optimizer"] - e["gathered"]
    predicted = step_bytes + 4 * (shape.root_params() + shape.layer_params())
    print(f"ckpt={ckpt}: measured peak {peak / 2**20:.1f} MiB, calculator {predicted / 2**20:.1f}")
    # measured 218 MiB vs 222 (off), 75 MiB vs 81 (on)
    assert peak == pytest.approx(predicted, rel=0.15), (peak, predicted)


# --- the table ------------------------------------------------------------------------------------
def test_the_table_covers_qwen3_4b_8b_32b_and_their_real_parameter_counts(capsys):
    # Published sizes: 4.0B, 8.2B, 32.8B parameters.
    assert QWEN3["Qwen3-4B"].params() / 1e9 == pytest.approx(4.02, abs=0.01)
    assert QWEN3["Qwen3-8B"].params() / 1e9 == pytest.approx(8.19, abs=0.01)
    assert QWEN3["Qwen3-32B"].params() / 1e9 == pytest.approx(32.76, abs=0.01)
    assert main(["--table"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in QWEN3) and "H100" in out and "H200" in out
    for s in QWEN3.values():
        on = estimate(s, world=8, tokens=32768, checkpointing=True)
        off = estimate(s, world=8, tokens=32768, checkpointing=False)
        assert off["total"] > 4 * on["total"]  # checkpointing is what makes 32k tokens fit
        # one 1024-token fp32 slab of a 152k vocabulary (1.5 GiB, plus the kept final hidden
        # states) against every token's logits at once
        dense = estimate(s, world=8, tokens=32768, checkpointing=True, logits_chunk=0)
        assert on["logits"] < 2.5 * 2**30 and dense["logits"] > 40 * 2**30


# --- the reference model ---------------------------------------------------------------------------
def test_the_reference_model_is_a_frozen_compute_dtype_copy_and_a_step_runs(tmp_path):
    from trainer.fakes import synthetic_trace
    from trainer.loop import StepInput, run_step
    from trainer.rows import trace_to_rows

    model = small_qwen3(layers=2, vocab=500)
    initial = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    trainer = make_trainer(model, tmp_path, beta=0.1, dtype="bfloat16")
    ref = trainer.ref_model
    assert ref is not trainer.model and not any(p.requires_grad for p in ref.parameters())
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert torch.equal(ref.model.layers[0].mlp.up_proj.weight, initial.to(torch.bfloat16))
    rows = trace_to_rows(synthetic_trace(random.Random(0), vocab=500, prompt_len=12,
                                         completion_len=6, tool_len=4))[0]
    metrics = run_step(trainer, StepInput(rows=rows, advantages=[1.0] * len(rows)))
    assert trainer.state.policy_version == 1 and metrics["policy/kl_ref_k3"] >= 0.0
    # the reference did not move with the policy
    assert torch.equal(ref.model.layers[0].mlp.up_proj.weight, initial.to(torch.bfloat16))
    assert not torch.equal(trainer.model.model.layers[0].mlp.up_proj.weight, initial)


def test_a_deep_copy_of_a_used_model_runs_its_own_weights_not_the_originals():
    # The chunked forward is cached on the model; a deepcopy (how a module's reference model is
    # made) must not keep calling the original's.
    import copy

    model = small_qwen3(layers=1)
    mb = random_microbatch(16, 1000)
    with torch.no_grad():
        before, _ = microbatch_logprobs(model, mb, 1.0)
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.mul_(0.5)
        assert torch.equal(microbatch_logprobs(model, mb, 1.0)[0], before)
        assert not torch.allclose(microbatch_logprobs(twin, mb, 1.0)[0], before)


def test_the_reference_model_adds_its_bf16_shard_and_gathered_layers_to_the_total(capsys):
    s = QWEN3["Qwen3-32B"]
    plain = estimate(s, world=8, tokens=32768, checkpointing=True)
    ref = estimate(s, world=8, tokens=32768, checkpointing=True, reference=True)
    term = 2 * s.params() / 8 + 2 * (2 * s.layer_params() + s.root_params())
    assert "reference" not in plain and ref["reference"] == term
    assert ref["total"] == pytest.approx(plain["total"] + term)
    assert main(["--table", "--reference"]) == 0
    with_ref = capsys.readouterr().out
    assert main(["--table"]) == 0
    without = capsys.readouterr().out
    row = next(line for line in with_ref.splitlines() if line.startswith("| Qwen3-32B"))
    assert f"{ref['total'] / 2**30:.1f}" in row and "with the reference" in with_ref
    assert "with the reference" not in without


def test_sgd_keeps_no_optimizer_state_and_the_calculator_counts_none(capsys):
    import torch

    s = QWEN3["Qwen3-8B"]
    adamw = estimate(s, world=8, tokens=32768, checkpointing=True)
    sgd = estimate(s, world=8, tokens=32768, checkpointing=True, optimizer="sgd")
    assert adamw["optimizer"] == 8 * s.params() / 8 and sgd["optimizer"] == 0
    assert sgd["total"] == pytest.approx(adamw["total"] - adamw["optimizer"])
    # What trainer/grpo.py builds for optimizer="sgd": no per-parameter state after a step.
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1, weight_decay=0.0)
    w.sum().backward()
    opt.step()
    assert not any(opt.state[w])
    assert main(["--table", "--optimizer", "sgd"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| Qwen3-8B"))
    assert f"{sgd['total'] / 2**30:.1f} /" in row
