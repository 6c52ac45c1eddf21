"""The fused decode step (``docs/drm.md`` section A.4.5, "The fused step"): one C call
(:mod:`drmlab.ops.decode_step`) for a token inside an open block, in place of the stages' fast steps
and the emitter.

It runs the same maths as :meth:`DRMModel.step` on the block's step constants (``PrefixState.constants``),
with the sums in another order: its logits and states equal :meth:`DRMModel.step_reference`'s to
round-off, not bit for bit, so it is opt-in (:meth:`DRMModel.step_fused`). It covers the block path
of geometry and prefix (directions or the direct transition; post-naturalization or metric-first),
causal mixer, token residual and selective memory, each optional, in that order; every other model
(:func:`unsupported` says why) and every token it cannot take (:func:`token_unsupported`: a block's
first token, where the constants are made, autograd, autocast, another dtype or device) is stepped by
the fast step. The new state is the fast step's, except that the mixer's cache is left to be remade
(``MixerState.cache`` is derived; the fused step reads the convolution windows). The kernel's first token in
a process is checked against the fast step (:func:`first_use_check`, :mod:`drmlab.ops.self_check`): where it
fails, the fast step takes every token, said in one line.
"""

from __future__ import annotations

import math

import torch

from drmlab.ops import decode_step, self_check

from .stages import MemoryStage, MixerStage, PrefixStage, TokenResidualStage, stepping
from .stages.geometry import PrefixState
from .stages.memory import MemoryState
from .stages.mixer import MixerState

_ORDER = (PrefixStage, MixerStage, TokenResidualStage, MemoryStage)  # the kernel's stages, in its order
_SLOT = {name: i for i, name in enumerate(decode_step.POINTER_SLOTS)}
_INT = {name: i for i, name in enumerate(decode_step.INTEGER_SLOTS)}
_REAL = {name: i for i, name in enumerate(decode_step.REAL_SLOTS)}
# Above this many rows torch's matrix products (MKL's GEMMs) outrun the kernel's plain C loops (tiny, one
# thread, bench_decode.py: at batch 8 the kernel is 1.5x the fast step for J, 0.86x for SSM_CONTROL with
# its wide memory; at batch 64 0.57x and 0.33x)
MAX_BATCH = 8
_CPU = torch.device("cpu")


def unsupported(model) -> str | None:
    """Why the fused step never applies to ``model`` (its structure or settings), or None."""
    c = model.config
    if c.sequence_mode != "block_cumsum":
        return f"sequence_mode={c.sequence_mode!r}: every token is its own block (no block constants)"
    if model.rank_controller is not None:
        return "variable rank: the fused step has no rank projection"
    if c.toroidal_dims:
        return "toroidal_dims > 0: the fused step reads the state without the toroidal lift"
    if c.step_mode != "velocity":
        return f"step_mode={c.step_mode!r}: the block constants are made for step_mode='velocity' only"
    if c.metric == "pullback" or c.has_degenerate_metric:
        return "a pullback or degenerate metric: its naturalizer has no block constants"
    position = 0
    for stage in model.stages:
        kinds = [k for k in _ORDER[position:] if type(stage) is k]
        if not kinds:
            return f"the {stage.name!r} stage has no fused form"
        position = _ORDER.index(kinds[0]) + 1
    mixer = model.mixer
    if mixer is not None and any(conv.bias is None for conv in mixer.depthwise):
        return "a mixer convolution without bias"
    return None


def token_unsupported(model, state) -> str | None:
    """Why the next token from ``state`` is stepped by the fast step instead, or None."""
    weight = model.embedding.weight
    if not weight.is_cpu:
        return "the fused step's kernel runs on the CPU"
    if not stepping.fast_step_supported(weight) or state.z_start.dtype != weight.dtype:
        return "autocast, or a dtype other than float32 / float64"
    if torch.is_grad_enabled() and weight.requires_grad:
        return "gradients are enabled: the kernel has no backward"
    if state.z_start.shape[0] > MAX_BATCH:
        return f"batch {state.z_start.shape[0]} > fused_step.MAX_BATCH = {MAX_BATCH}: the fast step's GEMMs are faster"
    if any(s is None and not isinstance(stage, TokenResidualStage) for stage, s in zip(model.stages, state.stages)):
        return "a block's first token (the fast step makes the block constants)"
    return None


class _Mixed(Exception):
    """A buffer of another dtype or device than the embedding's (a partly cast model)."""


class _Weights:
    """The kernel's view of the model's weights: each matrix transposed into a contiguous copy (the kernel
    reads [in, out]), every vector and the embedding as they are, their addresses in their pointer
    slots and the settings that come from the model alone. Made again whenever a weight's storage,
    version (an in-place update: a training step) or dtype changes (``key``)."""

    def __init__(self, model):
        c, f, emitter = model.config, model.transition, model.emitter
        # (slot, tensor, transpose) in slot order
        entries = [
            ("embedding", model.embedding.weight, False),
            ("norm_w", emitter.norm.weight, False),
            ("emit_w1", emitter.fc1.weight, True),
            ("emit_b1", emitter.fc1.bias, False),
            ("emit_w2", emitter.fc2.weight, True),
            ("emit_b2", emitter.fc2.bias, False),
        ]
        self.sizes = dict(state=c.d_state, token=c.d_token, vocab=c.vocab_size, emit_hidden=emitter.fc1.out_features)
        self.sizes["bounded"] = int(c.bounded_state)
        eps = emitter.norm.eps if emitter.norm.eps is not None else torch.finfo(model.embedding.weight.dtype).eps
        self.reals = dict(dt=c.dt, radius=c.state_clip_norm, norm_eps=eps)  # eps: F.rms_norm's default where None
        self.dilations, self.layers = [], 0
        kinds = {type(stage) for stage in model.stages}
        if PrefixStage in kinds:
            module = f.flow if f.flow is not None else f.direct_transition
            entries += [
                ("flow_w1", module.fc1.weight, True),
                ("flow_b1", module.fc1.bias, False),
                ("flow_w2", module.fc2.weight, True),
                ("flow_b2", module.fc2.bias, False),
            ]
            self.sizes.update(has_prefix=1, flow_hidden=module.fc1.out_features, flow_out=module.fc2.out_features)
        if MixerStage in kinds:
            mixer = model.mixer
            entries += [
                ("mix_w", mixer.in_proj.weight, True),
                ("mix_b", mixer.in_proj.bias, False),
                ("mix_out_w", mixer.out_proj.weight, True),
                ("mix_out_b", mixer.out_proj.bias, False),
            ]
            base, width = len(decode_step.POINTER_SLOTS), len(decode_step.LAYER_SLOTS)
            for i, (conv, point) in enumerate(zip(mixer.depthwise, mixer.pointwise)):
                at = base + width * i
                entries += [(at, conv.weight, False), (at + 1, conv.bias, False)]
                entries += [(at + 2, point.weight, True), (at + 3, point.bias, False)]
            self.layers, self.dilations = len(mixer.dilations), list(mixer.dilations)
            self.sizes.update(has_mixer=1, mix_hidden=mixer.in_proj.out_features, mix_layers=self.layers)
            self.sizes["kernel"] = mixer.depthwise[0].kernel_size[0]
            self.reals["mix_scale"] = mixer.scale
        if TokenResidualStage in kinds:
            entries.append(("res_w", model.token_residual.proj.weight, True))
            self.sizes["has_residual"] = 1
            self.reals["res_scale"] = model.token_residual.scale
        if MemoryStage in kinds:
            memory = model.memory
            for (w, b), layer in zip(
                (("mem_w", "mem_b"), ("mem_fw", "mem_fb"), ("mem_ww", "mem_wb"), ("mem_cw", "mem_cb")),
                (memory.in_proj, memory.forget, memory.write, memory.candidate),
            ):
                entries += [(w, layer.weight, True), (b, layer.bias, False)]
            self.sizes.update(has_memory=1, mem_hidden=memory.in_proj.out_features)
            self.reals.update(mem_scale=memory.scale, forget_bias=memory.forget_bias)
        self.entries = [(_SLOT[slot] if isinstance(slot, str) else slot, t, tr) for slot, t, tr in entries]
        self.tensors = [t for _, t, _ in self.entries]
        self.key = None

    def pointers(self, dtype: torch.dtype) -> list:
        """The pointer slots with the weights' addresses filled in (the rest 0), the copies remade where
        a weight changed; raises :class:`_Mixed` where a weight is not a CPU tensor of ``dtype``."""
        key = [(t.data_ptr(), t._version, t.dtype) for t in self.tensors]
        if key != self.key:
            if any(t.dtype != dtype or not t.is_cpu for t in self.tensors):
                raise _Mixed
            self.held = [t.detach().t().contiguous() if tr else t.detach().contiguous() for _, t, tr in self.entries]
            self.template = [0] * (len(decode_step.POINTER_SLOTS) + len(decode_step.LAYER_SLOTS) * self.layers)
            for (slot, _, _), t in zip(self.entries, self.held):
                self.template[slot] = t.data_ptr()
            self.key = key
        return list(self.template)


class _Call:
    """The three slot arrays of one kernel call, filled by name; contiguous copies made on the way live
    as long as the call."""

    def __init__(self, weights: _Weights, dtype: torch.dtype):
        self.dtype = dtype
        self.pointers = weights.pointers(dtype)
        self.integers = [0] * len(decode_step.INTEGER_SLOTS)
        self.reals = [0.0] * len(decode_step.REAL_SLOTS)
        self.size(**weights.sizes)
        self.integers.extend(weights.dilations)
        self.real(**weights.reals)
        self.held = []

    def put(self, name: str | int, x: torch.Tensor | None) -> None:
        """The address of x (made contiguous where it is not) in pointer slot ``name`` (or index)."""
        if x is None:
            return
        if x.dtype != self.dtype or not x.is_cpu:
            raise _Mixed
        if not x.is_contiguous():
            x = x.contiguous()
            self.held.append(x)
        self.pointers[_SLOT[name] if isinstance(name, str) else name] = x.data_ptr()

    def size(self, **values: int) -> None:
        for name, value in values.items():
            self.integers[_INT[name]] = value

    def real(self, **values: float) -> None:
        for name, value in values.items():
            self.reals[_REAL[name]] = value


def _weights(model) -> _Weights:
    found = model.__dict__.get("_fused_weights")
    if found is None:
        found = model.__dict__["_fused_weights"] = _Weights(model)
    return found


def step(model, tokens_t: torch.Tensor, state, strength: float):
    """(logits [B, vocab], the new DecodeState) for ``tokens_t`` [B] (checked by the caller), or None where
    the fused step does not take this token (the caller steps it by the fast step); ``model`` passed
    :func:`unsupported`."""
    dtype = state.z_start.dtype
    if token_unsupported(model, state) is not None or decode_step.unavailable(dtype) is not None:
        return None
    verdict = self_check.recorded("decode_step", "c", _CPU, dtype)
    if verdict is not None and not verdict.passed:  # failed its first-use check: the fast step runs
        return None
    prefix = mixer_state = memory_state = None
    for stage, s in zip(model.stages, state.stages):
        kind = type(stage)
        if kind is PrefixStage:
            prefix = s
        elif kind is MixerStage:
            mixer_state = s
        elif kind is MemoryStage:
            memory_state = s
    if prefix is not None:
        k = prefix.constants
        if k is None or k.strength != strength or prefix.delta_sum is None:
            return None
    try:
        call = _Call(_weights(model), dtype)
        logits, kept, z = _fill(call, tokens_t, state, prefix, mixer_state, memory_state, model.token_residual)
    except _Mixed:
        return None
    decode_step.run(dtype, call.pointers, call.integers, call.reals)
    return logits, model._after(state.z_start, state.position + 1, kept, z)


def _tensors(state) -> list[torch.Tensor]:
    """The tensors a DecodeState carries (z_start, then each stage's fields but its derived caches)."""
    found = [state.z_start]

    def walk(x):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            for item in x:
                walk(item)

    for s in state.stages:
        if s is not None:
            walk([getattr(s, name) for name in s._fields if name not in getattr(s, "CACHE_FIELDS", ())])
    return found


def first_use_check(out, dtype: torch.dtype, reference):
    """The fused step's first-use self-check (:mod:`drmlab.ops.self_check`): on the first
    token the kernel takes in this process (per dtype), ``reference()`` -- the fast step of the same token
    and state, :meth:`DRMModel.step_reference`'s logits bit for bit -- runs too, and the kernel's logits
    and new state are held to it with the tolerance of ``tests/models/test_fused_step.py``. Passed: ``out``
    (and the kernel is not checked again); failed: one line on stderr, the fast step's result, and every
    later token is stepped by the fast step (:func:`step` returns None)."""
    if self_check.recorded("decode_step", "c", _CPU, dtype) is not None:
        return out
    kept = []

    def compare() -> float:
        kept.append(reference())
        (logits, new), (ref_logits, ref_new) = out, kept[0]
        got, want = [logits, *_tensors(new)], [ref_logits, *_tensors(ref_new)]
        if len(got) != len(want):
            return math.inf
        return max(self_check.relative_error(a, b) for a, b in zip(got, want))

    record = self_check.verify("decode_step", "c", _CPU, dtype, run=compare, isolate=False)
    if record is None or record.passed:
        return out
    self_check.announce(record, "fast step")
    return kept[0] if kept else reference()


def _check_shape(name: str, x: torch.Tensor, shape: tuple) -> None:
    """The kernel trusts its buffers' sizes: a state buffer of another shape than this model's (a hand-made
    or foreign DecodeState) is refused here, before any C code reads it."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"step_fused: the state's {name} has shape {tuple(x.shape)}, this model's is {tuple(shape)}; "
            "pass a DecodeState made by this model (init_state / prefill / step)"
        )


def _check_state(call: _Call, state, prefix, mixer_state, memory_state) -> None:
    """Every state buffer the kernel reads has the shape the model's sizes say (:func:`_check_shape`)."""
    n = call.integers
    batch, d = state.z_start.shape[0], n[_INT["state"]]
    _check_shape("z_start", state.z_start, (batch, d))
    if prefix is not None:
        _check_shape("prefix delta_sum", prefix.delta_sum, (batch, 1, d))
    if mixer_state is not None:
        _check_shape("mixer previous", mixer_state.previous, (batch, 1, d))
        if len(mixer_state.contexts) != n[_INT["mix_layers"]]:
            raise ValueError(
                f"step_fused: the state holds {len(mixer_state.contexts)} mixer windows, this model has "
                f"{n[_INT['mix_layers']]} layers; pass a DecodeState made by this model"
            )
        width, kernel = n[_INT["mix_hidden"]], n[_INT["kernel"]]
        for i, (context, dilation) in enumerate(
            zip(mixer_state.contexts, call.integers[len(decode_step.INTEGER_SLOTS) :])
        ):
            _check_shape(f"mixer window {i}", context, (batch, dilation * (kernel - 1), width))
    if memory_state is not None:
        _check_shape("memory previous", memory_state.previous, (batch, 1, d))
        _check_shape("memory", memory_state.memory, (batch, d))


def _check_constants(call: _Call, prefix, batch: int) -> None:
    """The block's cached constants have the element counts the kernel reads for this model and batch
    (state part B x H, gates B x n, directions B x n x d with n the flow's outputs, the solve's factors
    B x d, B x d x r, B x r x r, dimD and rho one per row): a foreign or hand-made prefix state is
    refused before the C code reads past a buffer."""
    n, k = call.integers, prefix.constants
    d, hidden, outputs = n[_INT["state"]], n[_INT["flow_hidden"]], n[_INT["flow_out"]]
    want = {"state_part": (k.state_part, batch * hidden), "dim_d": (k.dim_d, batch), "rho": (prefix.geometry[4], batch)}
    if k.directions is not None:
        count = k.directions.shape[-2]
        if count != outputs:
            raise ValueError(
                f"step_fused: the block constants hold {count} directions, this model's flow gives {outputs}; "
                "pass a DecodeState made by this model"
            )
        want.update(gates=(k.gates, batch * count), directions=(k.directions, batch * count * d))
    if k.solve is not None:
        damped, u_factor, scaled, chol = k.solve
        want["damped"] = (damped, batch * d)
        if u_factor is not None:
            rank = u_factor.shape[-1]
            want.update(u_factor=(u_factor, batch * d * rank), scaled=(scaled, batch * d * rank))
            want["chol"] = (chol, batch * rank * rank)
    for name, (x, count) in want.items():
        if x is not None and x.numel() != count:
            raise ValueError(
                f"step_fused: the block constants' {name} has {x.numel()} elements, this model reads {count}; "
                "pass a DecodeState made by this model"
            )


def _fill(call: _Call, tokens_t, state, prefix, mixer_state, memory_state, token_residual):
    """Put the state's buffers into ``call`` and make the outputs: (logits, the stages' new states, z)."""
    _check_state(call, state, prefix, mixer_state, memory_state)
    put, z_start = call.put, state.z_start
    batch, d = z_start.shape
    dtype = z_start.dtype
    tokens = tokens_t.long().contiguous()
    call.pointers[_SLOT["tokens"]] = tokens.data_ptr()
    call.held.append(tokens)
    z_out = torch.empty(batch, d, dtype=dtype)
    logits = torch.empty(batch, call.integers[_INT["vocab"]], dtype=dtype)
    put("z_start", z_start)
    put("z_out", z_out)
    put("logits", logits)
    call.size(batch=batch)
    kept = []
    if prefix is not None:
        _check_constants(call, prefix, batch)
        k = prefix.constants
        delta_sum = torch.empty(batch, 1, d, dtype=dtype)
        put("state_part", k.state_part)
        put("dim_d", k.dim_d)
        put("rho", prefix.geometry[4])
        put("delta_sum", prefix.delta_sum)
        put("delta_sum_out", delta_sum)
        if k.directions is not None:
            call.size(directions=k.directions.shape[-2])
            put("gates", k.gates)
            put("directions", k.directions)
        if k.solve is not None:
            damped, u_factor, scaled, chol = k.solve
            put("damped", damped)
            if u_factor is not None:
                call.size(rank=u_factor.shape[-1])
                put("u_factor", u_factor)
                put("scaled", scaled)
                put("chol", chol)
        call.real(strength=k.strength)
        kept.append(PrefixState(prefix.geometry, prefix.frame, delta_sum, k))
    if mixer_state is not None:
        previous = torch.empty(batch, 1, d, dtype=dtype)
        put("mix_previous", mixer_state.previous)
        put("mix_previous_out", previous)
        contexts, base, width = [], len(decode_step.POINTER_SLOTS), len(decode_step.LAYER_SLOTS)
        for i, context in enumerate(mixer_state.contexts):
            contexts.append(torch.empty(context.shape, dtype=dtype))
            put(base + width * i + 4, context)
            put(base + width * i + 5, contexts[-1])
        kept.append(MixerState(previous, contexts))  # the cache is remade from the windows where needed
    if token_residual is not None:
        kept.append(None)
    if memory_state is not None:
        previous, m = torch.empty(batch, 1, d, dtype=dtype), torch.empty(batch, d, dtype=dtype)
        put("mem_previous", memory_state.previous)
        put("mem_m", memory_state.memory)
        put("mem_previous_out", previous)
        put("mem_m_out", m)
        kept.append(MemoryState(previous, m))
    return logits, kept, z_out
