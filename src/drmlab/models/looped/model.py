r"""The looped language model of the looped-residual study (``docs/looped.md`` sections 1-3).

Registered as ``LOOPED``. ``build_model("LOOPED", preset, arm="C")`` builds one of the study's
named arms; ``n_stored=``, ``n_loop=``, ``schedule=``, ``eps=``, ``mixer=`` (and every other
:class:`LoopedConfig` field) override the arm's settings.

Skeleton: token embedding + learned absolute position table -> block applications in schedule
order -> final LayerNorm -> tied LM head (logits = LN_f(x) Eᵀ, no bias). No dropout.

Block (pre-LN, both branches scaled by the same s; :class:`~drmlab.models.layers.PreLNBlock`):

    x <- x + s · Mixer(LN1(x));   x <- x + s · MLP(LN2(x)),   MLP = W2 GELU(W1 z + b1) + b2, 4x wide

with s = ε, or s = ε·λ_b (λ_b a learnable scalar per stored block, init 1, shared by that block's
applications) when ``learnable_eps``. Mixers: ``attn`` (causal multi-head self-attention, biases on
the fused QKV and the output projection: :class:`~drmlab.models.layers.CausalSelfAttention`),
``ssm`` (the study's :class:`~.selective_ssm.SelectiveSSM` with ``ssm_variant="s6"``, or Mamba's
mixer at expand 1, :class:`~drmlab.models.layers.MambaMixer`, with ``"mamba"``; ``ssm_conv`` = conv
kernel, 0 = none) or ``hybrid`` (stored block i is attention iff ``i % attn_every == attn_offset``,
else SSM).

Schedules, the ε rules, the named arms and the preset widths: :mod:`.config`.

Initialisation (the original's): every Linear weight N(0, 0.02²) with zero biases, token and
position embeddings N(0, 0.02²), LayerNorms (1, 0); the fused QKV weight Xavier-uniform with zero
bias, the SSM conv at torch's default U(±1/√K), SSM ``a`` = 0 and ``D`` = 0 (Mamba's mixer: its
own step-size, A and D init). Then the three
write-back matrices (MLP ``W2``, attention output projection, SSM ``W_out``) are re-drawn from
N(0, (0.02/√(2·depth))²) with depth = L·N (``proj_init_depth="stored_x_loop"``, the original; 14
for HE although only 12 applications run) or the number of applications
(``proj_init_depth="applications"``).

Positions: ``positions="learned"`` (default, as the original) adds a learned table of
``max_seq_len`` rows, so the model sets ``has_position_limit = True`` and raises ValueError for
longer inputs (forward and step); ``positions="none"`` drops it (no length limit; the study's MQAR
model had none).

Generation: ``init_state(batch)`` / ``step(tokens_t, state)`` keep, per block *application*, a
key/value cache (attention) or the SSM state and conv context (O(1) per token); stepping a
sequence reproduces the parallel logits, and ``forward(tokens, return_state=True)`` returns the
same state after a whole prompt from the parallel pass. ``residual_stream(tokens)`` returns the residual stream
after every application (for :mod:`drmlab.experiments.probes.residual`).

Another loop count at evaluation (``docs/looped.md`` section 4.1): ``set_loop_count(n_loop, eps=...)`` applies
the same stored blocks N' times instead of N, with ε frozen at the value the model was built with or set
anew (``"1/N"`` gives 1/N'); the parameters are untouched.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens, leading_batch
from drmlab.models.layers import CausalSelfAttention, MambaMixer, PreLNBlock
from drmlab.models.legacy_names import accept_legacy_names
from drmlab.models.output import ModelOutput

from .config import LoopedConfig, block_kinds, resolve_eps, schedule_order
from .selective_ssm import SelectiveSSM

INIT_STD = 0.02
# parameter names of checkpoints written before the SSM's output projection was named like attention's
LEGACY_NAMES = ((".mixer.w_out.", ".mixer.out_proj."),)


def build_block(config: LoopedConfig, kind: str) -> PreLNBlock:
    """One stored block: attention, or the SSM of ``config.ssm_variant``."""
    d = config.d_model
    if kind == "attn":
        mixer = CausalSelfAttention(d, config.n_head)
    elif config.ssm_variant == "s6":
        mixer = SelectiveSSM(d, config.d_state, config.ssm_conv, init_std=INIT_STD)
    else:
        mixer = MambaMixer(d, config.d_state, d_conv=config.ssm_conv, expand=1)
    return PreLNBlock(mixer, d, config.mlp_ratio, config.layer_norm_eps, learnable_scale=config.has_learnable_scale)


@dataclass(frozen=True)
class LoopedState:
    """Decoding state: the next position and, per block application, the attention key/value
    cache or the SSM state. Never modified in place."""

    position: int
    layers: tuple


class LoopedLM(nn.Module):
    """A looped (weight-tied) pre-LN language model; see the module docstring."""

    def __init__(self, config: LoopedConfig, seed: int = 0, name: str = "LOOPED", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.seed, self.model_name, self.preset = config, seed, name, preset
        c = config
        self.order = tuple(schedule_order(c))
        self.eps = c.eps_value
        self.trained_eps = self.eps  # the residual scale the model was built (and trained) with
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
            if c.positions == "learned":
                self.pos_emb = nn.Parameter(torch.empty(c.max_seq_len, c.d_model))
            else:
                self.register_parameter("pos_emb", None)
            self.blocks = nn.ModuleList(build_block(c, kind) for kind in block_kinds(c))
            self.ln_f = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
            self._init_weights()
        accept_legacy_names(self, LEGACY_NAMES)

    @property
    def has_position_limit(self) -> bool:
        return self.config.positions == "learned"

    @property
    def application_blocks(self) -> tuple[int, ...]:
        """The stored block of each application (for diagnostics)."""
        return self.order

    @property
    def write_back_std(self) -> float:
        return INIT_STD / math.sqrt(2 * self.config.effective_depth)

    def _init_weights(self) -> None:
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, INIT_STD)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, 0.0, INIT_STD)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
            if self.pos_emb is not None:
                nn.init.normal_(self.pos_emb, 0.0, INIT_STD)
            for block in self.blocks:
                if isinstance(block.mixer, CausalSelfAttention):
                    nn.init.xavier_uniform_(block.mixer.qkv_weight)
                    nn.init.zeros_(block.mixer.qkv_bias)
                else:
                    block.mixer.reset_parameters()
            std = self.write_back_std
            for block in self.blocks:
                for weight in block.write_back_weights():
                    nn.init.normal_(weight, 0.0, std)

    # ------------------------------------------------------------------ loop count at evaluation
    def set_loop_count(self, n_loop: int, eps: float | str = "frozen") -> LoopedLM:
        """From now on apply each looped block ``n_loop`` times (N') in the config's schedule, with the
        same parameters (``docs/looped.md`` section 4.1). Returns the model.

        ``eps``: ``"frozen"`` keeps the residual scale the model was built with (its trained ε, whatever
        loop count was set since); any ε the config accepts sets it anew at N' -- a number, or a rule
        such as ``"1/N"`` (ε = 1/N'). A learnable per-block scale λ_b keeps its value either way. At the
        built N with ε frozen the model computes exactly what it computed before. A vanilla stack
        (schedule ``"vanilla"``) has no loop to change: ValueError.
        """
        c = self.config
        if c.schedule == "vanilla":
            raise ValueError(
                f"{self.model_name} (arm {c.arm}) is a vanilla stack: schedule 'vanilla' applies each "
                f"stored block once, so it has no loop count to change"
            )
        if isinstance(n_loop, bool) or not isinstance(n_loop, int) or n_loop <= 0:
            raise ValueError(f"the loop count must be a positive integer, got {n_loop!r}")
        value = self.trained_eps if eps == "frozen" else resolve_eps(dataclasses.replace(c, n_loop=n_loop, eps=eps))
        config = dataclasses.replace(c, n_loop=n_loop, eps=value, learnable_eps=c.has_learnable_scale)
        config.validate()
        self.config, self.order, self.eps = config, tuple(schedule_order(config)), config.eps_value
        return self

    # ------------------------------------------------------------------ forward
    def _check_length(self, length: int) -> None:
        if self.has_position_limit and length > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {length} exceeds LOOPED's learned position table (max_seq_len="
                f"{self.config.max_seq_len}); build the model with a larger max_seq_len or positions='none'"
            )

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        self._check_length(tokens.shape[1])
        x = self.tok_emb(tokens.long())
        if self.pos_emb is not None:
            x = x + self.pos_emb[: tokens.shape[1]]
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.tok_emb.weight)

    def forward(
        self,
        tokens: torch.Tensor,
        step: int | None = None,
        return_state: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, V]; logits[:, t] predicts token t + 1. ``step`` is ignored.
        ``return_state``: ``.state`` is the decoding state after the last token. ``logits_at``: the head
        at those positions only (:mod:`drmlab.models.inputs`)."""
        x = self.embed(tokens)
        check_logits_at(logits_at, tokens, self.model_name)
        layers = []
        for i in self.order:
            x = self.blocks[i](x, self.eps, return_state=return_state)
            if return_state:
                x, layer_state = x
                layers.append(layer_state)
        state = LoopedState(position=tokens.shape[1], layers=tuple(layers)) if return_state else None
        return ModelOutput(logits=self.head(x if logits_at is None else x[logits_at]), aux={}, state=state)

    def residual_stream(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """[x_0, x_1, ..., x_K]: the embedded input and the stream after each of the K applications."""
        x = self.embed(tokens)
        stream = [x]
        for i in self.order:
            x = self.blocks[i](x, self.eps)
            stream.append(x)
        return stream

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> LoopedState:
        check_batch_size(batch_size, self.model_name)
        ref = self.tok_emb.weight
        layers = tuple(self.blocks[i].init_state(batch_size, ref.dtype, ref.device) for i in self.order)
        return LoopedState(position=0, layers=layers)

    def step(
        self, tokens_t: torch.Tensor, state: LoopedState, step: int | None = None
    ) -> tuple[torch.Tensor, LoopedState]:
        """Advance by one token: tokens_t [B] -> (logits [B, V], new state). Reproduces ``forward``."""
        if len(state.layers) != len(self.order):
            raise ValueError(f"state has {len(state.layers)} layer states, the model applies {len(self.order)} blocks")
        check_step_tokens(tokens_t, self.config.vocab_size, leading_batch(state.layers), self.model_name)
        self._check_length(state.position + 1)
        x = self.tok_emb(tokens_t.long())
        if self.pos_emb is not None:
            x = x + self.pos_emb[state.position]
        layers = []
        for i, layer_state in zip(self.order, state.layers):
            x, layer_state = self.blocks[i].step(x, layer_state, self.eps)
            layers.append(layer_state)
        return self.head(x), LoopedState(position=state.position + 1, layers=tuple(layers))
