"""docs/adding-a-model.md's example model, taken from the page itself (the code between its ``example model``
markers) and added to the registry for this module's tests with ``drmlab.models.add_family``, passes the tests
every registered model passes -- the functions those files parametrize over ``list_models()``, called with its
name: stepping equals the forward, causality, the prefill state, the input contract, ``logits_at``, the frozen
bits, next-token training, linear FLOP counting, the Hugging Face round trip and greedy ``generate()`` -- and
what the page says of it: its parameter count is the closed form at every preset, its decode state 128 bytes at
micro at any length; ``drmlab train`` trains it, ``drmlab export`` exports the run, and a family added from
outside drmlab is refused in one line when it lacks a name of the contract."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from drmlab.cli import main
from drmlab.models import add_family, build_model, count_parameters, families, registry
from drmlab.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-model.md"
BEGIN, END = "<!-- example model: begin", "<!-- example model: end -->"
FAMILY, NAME = "gated_rnn", "GATED_RNN"


def example_source() -> str:
    """The example module's code, as the page prints it."""
    text = DOC.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(DOC)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    exec(compile(source, str(DOC), "exec"), module.__dict__)
    return module


@functools.cache
def _tests(relative: str) -> types.ModuleType:
    """A test module of the registry-wide tests, loaded from its file under a name of its own."""
    path = ROOT / "tests" / relative
    spec = importlib.util.spec_from_file_location(f"registry_wide_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _forget(family: str, names) -> None:
    """Undo an ``add_family`` (the registry, and the Hugging Face classes made for the family)."""
    families.ADDED.pop(family, None)
    for name in names:
        registry._BUILDERS.pop(name, None)
    if "drmlab.integrations.hf_models" in sys.modules:
        from drmlab.integrations import hf_config, hf_models

        for table in (hf_config.MODEL_TYPES, hf_config.CONFIG_CLASSES, hf_models.MODEL_CLASSES):
            table.pop(family, None)


@pytest.fixture(scope="module")
def example():
    """The page's module, its family added for this module's tests and removed after."""
    module = _module(FAMILY, example_source())
    add_family(FAMILY, module)
    try:
        yield module
    finally:
        _forget(FAMILY, module.MODEL_NAMES)
        sys.modules.pop(FAMILY, None)


def test_the_page_s_model_is_registered(example):
    from drmlab.models import list_models

    assert example.MODEL_NAMES == (NAME,) and NAME in list_models()
    assert families.family_module(FAMILY) is example and FAMILY in families.all_families()


def test_stepping_equals_the_forward_and_the_forward_is_causal(example):
    steps = _tests("models/test_step_equivalence.py")
    steps.test_step_equals_parallel_forward(NAME, torch.float32, 1e-5)
    steps.test_step_equals_parallel_forward(NAME, torch.float64, 1e-10)
    steps.test_the_forward_is_causal(NAME)


def test_the_prefill_reaches_the_stepped_state(example, monkeypatch):
    generation = _tests("generation/test_generation.py")
    for length in (5, 16, 22):
        generation.test_parallel_prefill_reaches_the_stepped_state((NAME, {}), length, monkeypatch)
    generation.test_prefill_then_decode_equals_pure_stepping(NAME)


def test_the_input_contract_and_logits_at(example):
    inputs, logits_at = _tests("models/test_model_inputs.py"), _tests("models/test_logits_at.py")
    inputs.test_forward_refuses_every_bad_input_with_one_error(NAME)
    inputs.test_integer_dtypes_give_the_long_logits(NAME)
    inputs.test_step_refuses_a_batch_other_than_its_state(NAME)
    inputs.test_step_refuses_bad_tokens_and_init_state_an_empty_batch(NAME)
    logits_at.test_logits_at_equals_the_full_logits_there(NAME)
    logits_at.test_a_loss_at_the_marked_positions_has_the_full_gradient(NAME)
    logits_at.test_a_bad_mask_is_refused_naming_the_model(NAME)


def test_it_trains_on_the_next_token_with_seeded_weights(example):
    _tests("models/test_model_registry.py").test_a_frozen_model_computes_the_same_bits_as_a_trainable_one(NAME)
    _tests("training/test_training.py").test_every_registered_model_trains_on_next_token(NAME)
    _tests("training/test_utilisation.py").test_a_registered_models_step_flops_are_linear_in_the_batch(NAME)
    a, b = build_model(NAME, "micro", seed=4), build_model(NAME, "micro", seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_parameter_count_is_the_closed_form_at_every_preset(example):
    for preset in PRESETS:
        with torch.device("meta"):
            model = build_model(NAME, preset)
        assert count_parameters(model) == example.closed_form_parameter_count(model.config), preset
    assert 0.9e6 < example.closed_form_parameter_count(example.build_config("tiny")) < 1.2e6  # "about 1M"


def test_the_decode_state_keeps_its_128_bytes_at_any_length(example):
    from drmlab.experiments.mqar.distance import decode_state_grows, state_nbytes

    model = build_model(NAME, "micro").eval()
    with torch.no_grad():
        for length in (1, 40, 300):
            state = model(torch.zeros(1, length, dtype=torch.long), return_state=True).state
            assert state_nbytes(state) == 2 * 16 * 4 == 128
    assert not decode_state_grows(model)


def test_the_hugging_face_round_trip_and_generate(example, tmp_path):
    pytest.importorskip("transformers")
    hf = _tests("integrations/test_hf_models.py")
    hf.test_save_pretrained_round_trips_bit_for_bit(NAME, {}, tmp_path)
    hf.test_greedy_generate_equals_drmlab_generate(NAME)
    import drmlab.hf as dhf

    assert dhf.MODEL_TYPES[FAMILY] == "drmlab-gated-rnn"
    assert dhf.model_class(FAMILY).__name__ == "DrmlabGatedRnnForCausalLM"


def test_drmlab_train_and_export_take_it(example, tmp_path, capsys):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from drmlab.runs import load_run_model

    corpus = tmp_path / "notes.txt"
    corpus.write_text("\n\n".join(f"note {i}: the gated recurrence keeps one vector per block" for i in range(400)))
    run = tmp_path / "runs" / "gated-notes"
    data = ["--data", str(corpus), "--cache-dir", str(tmp_path / "cache"), "--threads", "1", "--quiet"]
    assert main(["train", "--model", NAME, "--preset", "micro", "--steps", "4", "--out", str(run), *data]) == 0
    assert f"{NAME} micro seed 0: val CE" in capsys.readouterr().out
    out = tmp_path / "hf" / "gated-notes"
    assert main(["export", "--ckpt", str(run), "--out", str(out)]) == 0
    assert "exported as drmlab-gated-rnn" in capsys.readouterr().out
    model, _, _ = load_run_model(run)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)


def test_the_page_s_command_line_registers_it_from_outside(example, tmp_path):
    """The ``python -c`` line of section 3: a family added by the calling process reaches the command line."""
    (tmp_path / f"{FAMILY}.py").write_text(example_source())
    text = DOC.read_text()
    line = text[text.index('`python -c "') + 1 :].split("`", 1)[0]
    code = line.split('"')[1]
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}
    args = ["inspect", "--model", NAME, "--preset", "micro", "--length", "8", "--threads", "1"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{5712:,}" in done.stdout or "5712" in done.stdout


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: delattr(m, "closed_form_parameter_count"), "lacks closed_form_parameter_count"),
        (lambda m: m.PRESET_DIMS.pop("125m"), "it must size micro, tiny, small, 125m"),
        (lambda m: setattr(m, "MODEL_NAMES", ("J",)), "model name 'J' is already registered"),
    ],
)
def test_a_family_that_breaks_the_contract_is_refused_in_one_line(change, message):
    module = _module("broken_family", example_source())
    change(module)
    try:
        with pytest.raises(ValueError, match=message) as refused:
            add_family("broken", module)
        assert "\n" not in str(refused.value)
        with pytest.raises(ValueError, match="family 'drm' already exists"):
            add_family("drm", _module("drm_again", example_source()))
    finally:
        _forget("broken", ())
        sys.modules.pop("broken_family", None)
        sys.modules.pop("drm_again", None)
