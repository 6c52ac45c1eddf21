"""The models of the MQAR probe (docs/mqar.md sections 5-6): registered models at a chosen width,
and the study's anchor arms.

**Anchor arms** (:data:`ANCHOR_ARMS`: ``L1_ds8 L1_ds64 L4_ds8 L4_ds64 L4u_ds8 L4u_ds64``): the
study's MQAR model on the registered ``LOOPED`` body -- SSM mixer with the conv (kernel 4), d_model
128, no position embedding, final LN; L1 = 4 stored x 1 (eps 1), L4 = 1 x 4 (eps 1/N = 1/4), L4u =
1 x 4 (eps 1); d_state 8 or 64. With ``arm_model="study"`` (default) an arm also has the study's
untied head (``Linear(d, V)``, no bias) and torch's default initialisation (Linear
kaiming-uniform, Embedding N(0, 1), LayerNorm (1, 0), SSM ``a`` = ``D`` = 0, conv default; no GPT
re-draw), which reproduces the study's parameter counts exactly (705,316 / 762,884 / 201,481 /
215,873); ``arm_model="registry"`` keeps LOOPED as registered (tied head, GPT-2 init).

**Width** (:func:`width_overrides`), by the fields of the model's config:

    DRM families (A..J, J_*, SSM_CONTROL)  d_token = d_state = W
    GPT2                                   n_embd = W
    LLAMA                                  hidden_size = W
    LOOPED (and the anchor arms), MAMBA,
    RESOLVENT, RESOLVENT_ROPE, ...         d_model = W

Model settings apply after the width. A model whose learned position table (``max_seq_len`` /
``n_positions``) is shorter than the sequence gets it raised to the sequence length.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from drmlab.experiments.mqar.task import MQARTask
from drmlab.models.registry import config_fields

# The anchor arms: the study's MQAR model (docs/mqar.md section 5) on the registered LOOPED body.
ARM_SETTINGS: dict[str, dict] = {
    "L1": dict(n_stored=4, n_loop=1, eps=1.0),
    "L4": dict(n_stored=1, n_loop=4, eps="1/N"),
    "L4u": dict(n_stored=1, n_loop=4, eps=1.0),
}
ARM_D_STATES = (8, 64)
ARM_BASE = dict(
    arm=None, mixer="ssm", schedule="layer", ssm_conv=4, ssm_variant="s6", positions="none", d_model=128, mlp_ratio=4
)
ANCHOR_ARMS: dict[str, dict] = {
    f"{arm}_ds{d}": dict(ARM_BASE, **settings, d_state=d)
    for arm, settings in ARM_SETTINGS.items()
    for d in ARM_D_STATES
}
# The study's test accuracies (%, mean of seeds 0 and 1; docs/mqar.md section 6) and parameter counts.
ANCHOR_ACC: dict[tuple[str, int], float] = {
    ("L1_ds8", 4): 21.4,
    ("L4_ds8", 4): 18.6,
    ("L4u_ds8", 4): 16.2,
    ("L1_ds8", 16): 2.2,
    ("L4_ds8", 16): 3.8,
    ("L4u_ds8", 16): 1.7,
    ("L1_ds64", 4): 23.8,
    ("L4_ds64", 4): 59.8,
    ("L4u_ds64", 4): 38.8,
    ("L1_ds64", 16): 3.9,
    ("L4_ds64", 16): 2.1,
    ("L4u_ds64", 16): 1.6,
}
ANCHOR_PARAMS = {"L1_ds8": 705_316, "L1_ds64": 762_884, "L4_ds8": 201_481, "L4_ds64": 215_873}
ARM_MODELS = ("study", "registry")

# Config fields the width sets, first match wins (see the module docstring).
WIDTH_FIELDS = (("d_token", "d_state"), ("n_embd",), ("d_model",), ("hidden_size",))
POSITION_FIELDS = ("max_seq_len", "n_positions")


class StudyMQARModel(nn.Module):
    """The study's MQAR model around a registered LOOPED body: untied bias-free head and torch's
    default initialisation (see the module docstring). ``forward`` = body, final LN, head."""

    def __init__(self, body: nn.Module, seed: int):
        super().__init__()
        c = body.config
        self.body = body
        self.config, self.model_name, self.preset = c, body.model_name, body.preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in body.modules():
                if isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
                    module.reset_parameters()  # SSM a, D stay 0; the conv is already at torch's default
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, step: int | None = None):
        from drmlab.models.output import ModelOutput

        x = self.body.residual_stream(tokens)[-1]
        return ModelOutput(logits=self.lm_head(self.body.ln_f(x)), aux={})


def width_overrides(fields, width: int | None) -> dict:
    """The config fields the width sets for a model whose config has ``fields``."""
    if width is None:
        return {}
    for group in WIDTH_FIELDS:
        if all(f in fields for f in group):
            return {f: width for f in group}
    raise ValueError(f"width: the model's config has none of {', '.join(f for g in WIDTH_FIELDS for f in g)}")


def registry_entry(name: str) -> tuple[str, dict]:
    """(registered name, settings) of an anchor arm, ``NAME`` or ``NAME:ARM``."""
    from drmlab.models.registry import parse_model_spec

    if name in ANCHOR_ARMS:
        return "LOOPED", dict(ANCHOR_ARMS[name])
    return parse_model_spec(name)


def resolve_model(name: str, preset: str, task: MQARTask, width: int | None, overrides: dict) -> tuple[str, dict]:
    """(registered name, overrides) for ``name``: anchor-arm settings or the width, then ``overrides``,
    then a position table at least as long as the sequence."""
    registry, kw = registry_entry(name)
    fields = config_fields(registry, preset, task.vocab_size, **kw)
    kw.update(width_overrides(fields, width))
    kw.update(overrides)
    fields = config_fields(registry, preset, task.vocab_size, **kw)
    for key in POSITION_FIELDS:
        if key in fields and key not in overrides and isinstance(fields[key], int) and fields[key] < task.length:
            kw[key] = task.length
    return registry, kw


def build(
    name: str,
    preset: str,
    task: MQARTask,
    seed: int,
    width: int | None = None,
    overrides: dict | None = None,
    arm_model: str = "study",
) -> tuple[nn.Module, str, dict]:
    """(model, registered name, overrides) of one MQAR run."""
    from drmlab.models import build_model

    registry, kw = resolve_model(name, preset, task, width, dict(overrides or {}))
    model = build_model(registry, preset=preset, vocab_size=task.vocab_size, seed=seed, **kw)
    if name in ANCHOR_ARMS and arm_model == "study":
        model = StudyMQARModel(model, seed)
    return model, registry, kw
