"""`AsyncGRPOConfig`: every knob of the async GRPO trainer, typed, with one `validate()`.

Why one flat dataclass: the trainer has about thirty knobs, and a reader should see all of them
with their defaults in one screen (nanochat's "no giant config objects", torchtune's "airtight
configs": only fields the trainer reads). Names follow TRL's GRPOConfig where the idea is the
same (`num_generations`, `learning_rate`, `max_steps`, `epsilon`, `beta`) so TRL users feel at
home; the fields TRL lacks (IS cap, staleness rule, token budget) say so in their comment.

`validate()` returns every problem at once (torchtune's ConfigError): a run that would fail on
its fifth field should say so before a model loads, not after four restarts. The trainer calls
`check()` in `__init__`, before it touches the model or the session factory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from trainer.errors import ConfigError
from trainer.reward_shuffle import SHUFFLE_MODES

__all__ = ["AsyncGRPOConfig", "LORA_TARGET_MODULES", "LOSS_TYPES", "LOSS_NORMS", "OPTIMIZERS",
           "REPORT_TO", "STALENESS_RULES"]

LOSS_TYPES = ("tis_clip", "tis_pg")
LOSS_NORMS = ("token", "sequence")
OPTIMIZERS = ("adamw", "sgd")
STALENESS_RULES = ("correct", "drop")
# Every linear projection of a Qwen/Llama-family decoder layer (attention and MLP): LoRA on all of
# them is the QLoRA paper's finding (attention-only adapters trail full fine-tuning).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REPORT_TO = ("none", "jsonl", "trackio", "wandb")


@dataclass
class AsyncGRPOConfig:
    """All trainer settings. See `trainer/loss.py` for what the loss options mean."""

    # --- rollouts -----------------------------------------------------------------------------
    num_generations: int = 8  # rollouts per group (one task, one seed)
    groups_per_step: int = 1  # groups consumed by one optimizer step
    max_concurrent_rollouts: int = 8  # rollouts in flight at once (the trainer's own bound)
    # Refused when set: the trainer never talks to the engine itself. Point the session factory
    # at the engine and pass weight_sync=VLLMWeightSync(url, ...) (kept for TRL's name only).
    vllm_server_base_url: str | None = None
    temperature: float = 1.0  # sampling temperature, also used to score tokens in the loss
    max_tokens: int | None = 4096  # per-call completion cap enforced by the capture proxy
    # Visit train_dataset in a fresh order each epoch, seeded by `seed` (TRL's shuffle_dataset);
    # False: the dataset's own order. Without a train_dataset the source picks tasks by seed.
    shuffle_dataset: bool = True
    # --- optimisation -------------------------------------------------------------------------
    learning_rate: float = 1e-6
    # adamw: the usual. sgd: plain SGD (step = lr x gradient, no optimizer state). Tried against
    # the shuffled control's drift, on the idea that SGD's steps cancel as their gradients do
    # where AdamW's early ~lr x sign(g) steps need not; it drifted as much (docs/learning.md).
    optimizer: Literal["adamw", "sgd"] = "adamw"
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0  # linear warmup, then constant
    max_grad_norm: float | None = 1.0  # None: no clipping (grad norm is still logged)
    max_steps: int = 100  # trainer steps; each consumes `groups_per_step` groups
    seed: int = 0
    # compute dtype (auto: bf16 on CUDA, fp32 on CPU); parameters and AdamW state stay fp32
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # --- loss ---------------------------------------------------------------------------------
    loss_type: Literal["tis_clip", "tis_pg"] = "tis_clip"
    loss_norm: Literal["token", "sequence"] = "token"
    epsilon: float = 0.2  # lower clip: ratio below 1 - epsilon stops pushing a negative token
    epsilon_high: float | None = 0.28  # upper clip (DAPO clip-higher); None: same as epsilon
    is_cap: float = 2.0  # TIS cap C on pi_theta / mu (TRL has no such correction)
    scale_rewards: bool = True  # divide group-centred rewards by the group std
    # Control run: permute each group's rewards among its rollouts before the baseline, so
    # rewards no longer follow actions. A loop that learns from it has a bug (trainer/groups.py).
    shuffle_rewards: bool = False
    # How the control permutes: "balanced" cancels the signal a few rewards' permutation still
    # carries by chance, "uniform" does not (trainer/reward_shuffle.py, with what was measured).
    shuffle_mode: Literal["balanced", "uniform"] = "balanced"
    # Control run: each scored reward r becomes 1 - r (tampered rollouts keep their 0), so the
    # policy is pushed away from what the verifier pays. A loop that still rises has a bug.
    flip_rewards: bool = False
    beta: float = 0.0  # k3 KL coefficient to the initial (reference) policy; 0 = no ref model
    # --- async / staleness --------------------------------------------------------------------
    max_staleness: int = 1  # versions a token may lag the policy it trains (TRL: per group only)
    staleness_rule: Literal["correct", "drop"] = "correct"  # for tokens older than the bound
    # A turn a token limit cut (the capture marks it truncated): "train" it as sampled, "mask" its
    # completion, or "drop" the rollout's rows (its reward stays in the baseline). trainer/rows.py
    truncated_turns: Literal["train", "mask", "drop"] = "train"
    # A turn the capture could not place in the agent's own conversation (capture.placement: a
    # call the policy made itself with the session key) makes no rows unless this is True.
    train_unplaced_calls: bool = False
    # A summarizer call (the agent compacting its history; capture.aux) trains its sampled
    # tokens with the rollout's advantage when True; False (default until measured): context.
    train_summary_calls: bool = False
    # --- packing ------------------------------------------------------------------------------
    max_tokens_per_microbatch: int = 8192  # padding-free token budget of one forward
    # Prefix sharing: fold the step's rows into a prefix tree so each shared prefix
    # (a prompt, a rollout's history before a rewrite) is forwarded once (trainer/prefix_tree.py);
    # a micro-batch may then hold up to 1.25x max(budget, its longest row). False: dense packing.
    prefix_sharing: bool = True
    # --- memory ---------------------------------------------------------------------------------
    # Recompute each decoder layer in backward instead of keeping its activations ("auto": on
    # for CUDA, off for CPU, where the small test models fit and recompute costs ~1/3 more time).
    # A row longer than max_tokens_per_microbatch is still forwarded alone and whole (counted in
    # packing/over_budget_rows): size the budget for the longest row with
    # `python -m trainer.memory --tokens N` (GiB per GPU by term, checkpointing on and off).
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    # Tokens whose [tokens x vocabulary] fp32 logits exist at once in the log-prob and entropy
    # computation (trainer/loss.py chunked_token_logprobs); 0: the model's dense logits.
    logits_chunk_tokens: int = 1024
    # --- distributed (torchrun) ---------------------------------------------------------------
    # any collective of a step (also the gathers of a weight push, which pace the engine's
    # transfer); a hung rank ends the run after it. Checkpoint writes wait on the longer one.
    dist_timeout_s: float = 600.0
    step_wait_timeout_s: float = 6 * 3600.0  # how long ranks > 0 wait for rank 0's next step
    # --- LoRA (trainer/lora.py) -----------------------------------------------------------------
    # 0: full fine-tuning. R > 0: peft adapters of rank R train while the base stays frozen in the
    # compute dtype (no fp32 master copy, no AdamW state for it); pushes send the adapters alone.
    lora_rank: int = 0
    lora_alpha: float | None = None  # None: 2 * lora_rank (scale alpha / r = 2)
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = LORA_TARGET_MODULES
    # --- outputs ------------------------------------------------------------------------------
    output_dir: str = "outputs/grpo"
    # --- start-up and checkpoints ---------------------------------------------------------------
    # Sharded (torch.distributed.checkpoint) checkpoint every N steps and after the last step
    # (0: only after the last). Each costs a write of model + AdamW state (~16 bytes/parameter).
    save_steps: int = 50
    save_total_limit: int | None = 2  # checkpoints kept on disk
    export_model: bool = True  # the final model in HF layout at <output_dir>/model (rank 0)
    # FSDP2: when to reduce-scatter gradients. Once a step (after the last micro-batch) saves a
    # collective per micro-batch but holds every unit's UNSHARDED gradient (compute dtype) until
    # then: 2 bytes/parameter on every GPU (64 GB at 32B). "auto" reduces once where those fit in
    # a quarter of the GPU's memory and after every micro-batch where they do not (trainer/loop.py
    # defer_grad_sync; `python -m trainer.memory` shows both); True/False force it.
    reduce_grads_per_microbatch: bool | Literal["auto"] = "auto"
    logging_steps: int = 1  # metrics sinks get every N-th step (and the last); history all
    report_to: Literal["none", "jsonl", "trackio", "wandb"] = "jsonl"
    run_name: str | None = None
    project: str = "harness"
    resume_from_checkpoint: str | bool | None = None  # path, or True for output_dir's latest
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, logged with the run config

    # -------------------------------------------------------------------------------------------
    def sampling(self) -> dict[str, float | int]:
        """The policy the trainer trains: OpenEnv's `training_sampling` shape plus `max_tokens`.

        Everything but temperature is pinned to its no-op so the engine samples the full
        distribution the loss assumes; the capture proxy enforces it on every agent call.
        `seed` is the run's: the session factory derives each rollout's sampling seed from it and
        the rollout's name (the producer names rollouts `g{g}-r{k}`), so a rerun samples alike.
        """
        policy: dict[str, float | int] = {
            "temperature": float(self.temperature),
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "seed": int(self.seed),
        }
        if self.max_tokens is not None:
            policy["max_tokens"] = int(self.max_tokens)
        return policy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> list[str]:
        """Every problem with this config, each naming the field and the fix; [] when valid."""
        p: list[str] = []

        def positive_int(name: str, minimum: int = 1) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                p.append(f"{name}={value!r}: must be an integer >= {minimum}")

        for name in ("groups_per_step", "max_concurrent_rollouts", "max_steps", "logging_steps"):
            positive_int(name)
        if isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int) \
                or self.num_generations < 2:
            p.append(f"num_generations={self.num_generations!r}: must be an integer >= 2 "
                     "(a group-relative baseline needs at least 2 rollouts of one task)")
        positive_int("max_tokens_per_microbatch", 16)
        positive_int("max_staleness", 0)
        positive_int("logits_chunk_tokens", 0)
        if self.gradient_checkpointing not in (True, False, "auto"):
            p.append(f"gradient_checkpointing={self.gradient_checkpointing!r}: choose true, false "
                     "or auto (on for CUDA, off for CPU)")
        positive_int("save_steps", 0)
        positive_int("warmup_steps", 0)
        if self.max_tokens is not None:
            positive_int("max_tokens")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            p.append(f"temperature={self.temperature!r}: must be > 0 (training needs sampling)")
        for name in ("dist_timeout_s", "step_wait_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (value > 0 and math.isfinite(value)):
                p.append(f"{name}={value!r}: must be a finite number of seconds > 0")
        # 0 is allowed as a control: every step runs and pushes, the weights never move, so a
        # before/after change measures evaluation noise alone.
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not (self.learning_rate >= 0 and math.isfinite(self.learning_rate)):
            p.append(f"learning_rate={self.learning_rate!r}: must be >= 0 (0: the control "
                     "whose weights never move)")
        if self.shuffle_mode not in SHUFFLE_MODES:
            p.append(f"shuffle_mode={self.shuffle_mode!r}: must be one of "
                     f"{', '.join(SHUFFLE_MODES)}")
        if self.shuffle_rewards and self.flip_rewards:
            p.append("shuffle_rewards and flip_rewards: two controls at once measure neither; "
                     "run them as separate runs")
        if self.optimizer not in OPTIMIZERS:
            p.append(f"optimizer={self.optimizer!r}: must be one of {', '.join(OPTIMIZERS)}")
        if self.weight_decay < 0:
            p.append(f"weight_decay={self.weight_decay!r}: must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            p.append(f"max_grad_norm={self.max_grad_norm!r}: must be > 0, or None for no clip")
        if self.loss_type not in LOSS_TYPES:
            p.append(f"loss_type={self.loss_type!r}: choose one of {LOSS_TYPES}")
        if self.loss_norm not in LOSS_NORMS:
            p.append(f"loss_norm={self.loss_norm!r}: choose one of {LOSS_NORMS}")
        if not 0 < self.epsilon < 1:
            p.append(f"epsilon={self.epsilon!r}: must be in (0, 1)")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            p.append(f"epsilon_high={self.epsilon_high!r}: must be > 0, or None")
        upper = 1 + (self.epsilon_high if self.epsilon_high is not None else self.epsilon)
        if self.is_cap <= upper:
            # At equality the clipped branch and the truncated one tie for a negative-advantage
            # token with r = C, and torch.min passes the unclipped branch's gradient through:
            # dloss/dlogp was measured at -0.64 where the clip must make it 0.
            p.append(
                f"is_cap={self.is_cap!r}: must be > 1 + epsilon_high ({upper:g}); a cap at or "
                "inside the clip range truncates tokens the trust region still trusts, and at "
                "equality the clipped gradient leaks"
            )
        if self.beta < 0:
            p.append(f"beta={self.beta!r}: must be >= 0 (0 disables the reference model)")
        if self.truncated_turns not in ("train", "mask", "drop"):
            p.append(f"truncated_turns={self.truncated_turns!r}: choose train, mask or drop")
        if self.staleness_rule not in STALENESS_RULES:
            p.append(f"staleness_rule={self.staleness_rule!r}: choose one of {STALENESS_RULES}")
        if self.reduce_grads_per_microbatch not in (True, False, "auto"):
            p.append(f"reduce_grads_per_microbatch={self.reduce_grads_per_microbatch!r}: must "
                     "be True, False or 'auto'")
        if self.vllm_server_base_url is not None:
            p.append(f"vllm_server_base_url={self.vllm_server_base_url!r}: the trainer never "
                     "talks to the engine itself, so it would be ignored; point the session "
                     "factory at the engine and pass weight_sync=VLLMWeightSync(url, backend) "
                     "to push weights, and leave this None")
        if self.report_to not in REPORT_TO:
            p.append(f"report_to={self.report_to!r}: choose one of {REPORT_TO}")
        if not isinstance(self.prefix_sharing, bool):  # prefix sharing (issue 30)
            p.append(f"prefix_sharing={self.prefix_sharing!r}: must be True or False")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            p.append(f"dtype={self.dtype!r}: choose auto, float32 or bfloat16")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            p.append(f"save_total_limit={self.save_total_limit!r}: must be >= 1, or None")
        if not self.output_dir:
            p.append("output_dir is empty: give a directory for checkpoints and metrics")
        p.extend(self._lora_problems())
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            p.append(f"adam_betas={self.adam_betas!r}: two numbers in [0, 1)")
        return p

    @property
    def lora_scale_alpha(self) -> float:
        """lora_alpha as peft gets it (2 * rank when unset)."""
        return float(self.lora_alpha) if self.lora_alpha is not None else 2.0 * self.lora_rank

    def _lora_problems(self) -> list[str]:
        p: list[str] = []
        r = self.lora_rank
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            return [f"lora_rank={r!r}: must be an integer > 0 (0 or unset: full fine-tuning)"]
        if r == 0:
            return p
        a = self.lora_alpha
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float))
                              or not (a > 0 and math.isfinite(a))):
            p.append(f"lora_alpha={a!r}: must be > 0 (unset: 2 * lora_rank = {2 * r})")
        d = self.lora_dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            p.append(f"lora_dropout={d!r}: must be in [0, 1)")
        t = self.lora_target_modules
        if isinstance(t, str) or not t or not all(isinstance(m, str) and m for m in t):
            p.append(f"lora_target_modules={t!r}: give module names, e.g. "
                     f"{','.join(LORA_TARGET_MODULES)}")
        if self.beta > 0:
            # The reference policy would be the base with the adapters off; not built yet.
            p.append(f"beta={self.beta!r} with lora_rank={r}: the KL reference is not built for "
                     "LoRA runs yet; set beta=0")
        return p

    def check(self) -> None:
        """Raise one ConfigError listing every problem; return quietly when valid."""
        problems = self.validate()
        if problems:
            raise ConfigError(problems)
