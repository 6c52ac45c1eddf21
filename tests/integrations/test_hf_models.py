"""drmlab models in Hugging Face transformers (drmlab.hf, drmlab export; docs/integrations.md):
save_pretrained / from_pretrained round-trip bit for bit (tied weights once), an exported run equals
the run, greedy generate() equals drmlab generate token for token through the model's own decode
state, and foreign directories are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")  # the hf extra

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import drmlab.hf as dhf  # noqa: E402  (registers the drmlab model types)
from drmlab.cli import main  # noqa: E402
from drmlab.data import get_tokenizer  # noqa: E402
from drmlab.generation import generate  # noqa: E402
from drmlab.models import build_model  # noqa: E402
from drmlab.runs import RunDir, load_run_model  # noqa: E402

GENERATE_MODELS = ["J", "SSM_CONTROL", "GPT2", "LLAMA", "MAMBA", "LOOPED", "RESOLVENT"]


def _perturbed(name: str, seed: int = 3, **overrides) -> torch.nn.Module:
    """A micro model whose weights are not its seeded init (so nothing can pass by rebuilding it)."""
    model = build_model(name, "micro", seed=seed, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.eval()


def _make_run(path, name: str, seed: int = 3, **overrides):
    """A run directory as drmlab train leaves it (config.json, a committed checkpoint), for ``name`` at micro."""
    model = _perturbed(name, seed, **overrides)
    run = RunDir(path).create()
    run.write_config(
        {
            "model": name,
            "preset": "micro",
            "overrides": overrides,
            "vocab_size": 256,
            "tokenizer": "bytes",
            "train": {"seed": seed, "seq_len": 32},
        }
    )
    run.save_checkpoint(model, None, {"step": 7, "tokens": 7 * 256})
    return model


@pytest.mark.parametrize(
    "name, overrides",
    [("J", {}), ("GPT2", {}), ("LLAMA", {}), ("MAMBA", {}), ("LOOPED", {"arm": "C"}), ("RESOLVENT", {})],
    ids=lambda v: str(v) if v else "",
)
def test_save_pretrained_round_trips_bit_for_bit(name, overrides, tmp_path):
    model = _perturbed(name, **overrides)
    wrapped = dhf.DrmlabForCausalLM.from_drmlab(model, name, "micro", seed=3, overrides=overrides)
    assert wrapped.config.model_type == dhf.MODEL_TYPES[type(wrapped).config_class.family]
    wrapped.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is type(wrapped.config)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(wrapped) and not loaded.training
    want, got = model.state_dict(), loaded.model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
    if name in ("GPT2", "LLAMA"):  # the head is tied to the token embedding: stored once, tied again on loading
        from safetensors import safe_open

        embedding = {"GPT2": "transformer.wte", "LLAMA": "model.embed_tokens"}[name]
        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            stored = [k for k in f.keys() if k.endswith((f"{embedding}.weight", "lm_head.weight"))]
        assert stored == [f"model.hf.{embedding}.weight"]
        assert loaded.model.hf.lm_head.weight is loaded.model.hf.get_submodule(embedding).weight


def test_from_config_is_the_registry_build():
    config = dhf.config_for("MAMBA", "micro", seed=11)
    built = AutoModelForCausalLM.from_config(config)
    got, want = built.model.state_dict(), build_model("MAMBA", "micro", seed=11).state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("name", GENERATE_MODELS)
def test_greedy_generate_equals_drmlab_generate(name):
    """transformers' generate() prefills once and steps the model's own state: the tokens of drmlab generate."""
    model = _perturbed(name)
    wrapped = dhf.DrmlabForCausalLM.from_drmlab(model, name, "micro", seed=3)
    prompt, new = "def area(r):\n    ret", 12
    reference = generate(model, get_tokenizer("bytes"), prompt, max_new_tokens=new, temperature=0)
    calls = {"parallel": 0, "step": 0}
    forward, step = model.forward, model.step

    def counted_forward(*args, **kwargs):
        calls["parallel"] += 1
        return forward(*args, **kwargs)

    def counted_step(*args, **kwargs):
        calls["step"] += 1
        return step(*args, **kwargs)

    model.forward, model.step = counted_forward, counted_step
    ids = torch.tensor([list(prompt.encode())])
    out = wrapped.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
    assert out.sequences[0, ids.shape[1] :].tolist() == reference.new_tokens
    assert calls == {"parallel": 1, "step": new - 1}  # one prefill, then the cache is stepped
    cache = getattr(out, dhf.CACHE_OUTPUT_FIELD)
    assert isinstance(cache, dhf.DecodeStateCache) and cache.get_seq_length() == ids.shape[1] + new - 1


@pytest.mark.parametrize("name", ["J", "MAMBA"])
def test_the_recurrent_cache_does_not_grow(name):
    """After 6, 14 and 22 tokens (one place in micro J's blocks of 8) the cache holds as many numbers."""
    wrapped = dhf.DrmlabForCausalLM.from_drmlab(_perturbed(name), name, "micro", seed=3)
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(6))
    sizes = [
        _numbers_in(
            getattr(
                wrapped.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True),
                dhf.CACHE_OUTPUT_FIELD,
            )
        )
        for new in (2, 10, 18)
    ]
    assert sizes[0] == sizes[1] == sizes[2] > 0


def _numbers_in(cache) -> int:
    numels = []
    dhf.map_batch_rows(cache.state, lambda t: numels.append(t.numel()) or t)
    return sum(numels)


def test_a_returned_cache_continues_and_beam_search_reorders_it():
    model = _perturbed("J").double()
    wrapped = dhf.DrmlabForCausalLM.from_drmlab(model, "J", "micro", seed=3)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    whole = wrapped.generate(ids, max_new_tokens=8, do_sample=False)
    first = wrapped.generate(ids, max_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    # transformers 5.24 names the cache ``cache``, earlier 5.x ``past_key_values``, in and out
    cached = {dhf.CACHE_OUTPUT_FIELD: getattr(first, dhf.CACHE_OUTPUT_FIELD)}
    more = wrapped.generate(first.sequences, **cached, max_new_tokens=3, do_sample=False)
    assert torch.equal(more, whole)
    # beam search keeps its beams' rows of the state: the cached search equals the uncached one
    beams = dict(max_new_tokens=6, num_beams=3, do_sample=False)
    assert torch.equal(wrapped.generate(ids, **beams), wrapped.generate(ids, use_cache=False, **beams))


def test_labels_give_the_trainers_loss_and_padding_is_refused():
    from drmlab.training.trainer import targets_loss

    model = _perturbed("J")
    wrapped = dhf.DrmlabForCausalLM.from_drmlab(model, "J", "micro", seed=3)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        loss = wrapped(ids, labels=ids).loss
        want, _ = targets_loss(model, ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="cannot skip padding"):
        wrapped(ids, attention_mask=mask)


def test_export_equals_the_run_and_writes_the_bytes_tokenizer(tmp_path, capsys):
    for name, family in (("J", "drm"), ("LLAMA", "llama"), ("GPT2", "gpt2")):
        _make_run(tmp_path / f"run-{name}", name)
        out = tmp_path / f"hf-{name}"
        assert main(["export", "--ckpt", str(tmp_path / f"run-{name}"), "--out", str(out)]) == 0
        assert f"exported as {dhf.MODEL_TYPES[family]}" in capsys.readouterr().out
        model, _, _ = load_run_model(tmp_path / f"run-{name}")
        loaded = AutoModelForCausalLM.from_pretrained(out)
        tokens = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            assert torch.equal(loaded(tokens).logits, model(tokens).logits)
        record = json.loads((out / "drmlab_run.json").read_text())
        assert record["step"] == 7 and record["model"] == name
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "".join(map(chr, range(600))) + "\U0001f600 ünï\n\tx"  # "\x00" and "Ā" (U+0100) among them
    assert tokenizer.encode(text) == list(text.encode("utf-8")) and tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.convert_ids_to_tokens(list(range(256))) == _byte_chars()
    # a second export into the same folder needs --overwrite, and then replaces it
    assert main(["export", "--ckpt", str(tmp_path / "run-GPT2"), "--out", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["export", "--ckpt", str(tmp_path / "run-GPT2"), "--out", str(out), "--overwrite"]) == 0


def test_the_exported_tokenizer_pads_and_a_padded_batch_generates_or_is_refused_in_one_line(tmp_path, capsys):
    """The exported tokenizer had no pad or eos token: ``tok(texts, padding=True)`` failed until one guessed
    that the byte pad is spelled "Ā"."""
    model = _make_run(tmp_path / "run", "J")
    out = tmp_path / "hf"
    assert main(["export", "--ckpt", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert "pad and eos: byte 0" in capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (0, 0, 256)
    batch = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[97, 98, 0, 0], [97, 98, 99, 100]]
    assert tok.decode([104, 0, 105]) == "h\x00i" and tok.decode([104, 0, 105], skip_special_tokens=True) == "hi"
    loaded = AutoModelForCausalLM.from_pretrained(out)
    # prompts of one length: a padded batch with every mask 1 generates each row's drmlab generate tokens
    prompts = ["def f(x)", "import o"]
    batch = tok(prompts, padding=True, return_tensors="pt")
    got = loaded.generate(**batch, max_new_tokens=6, do_sample=False)
    for row, prompt in zip(got, prompts):
        want = generate(model, get_tokenizer("bytes"), prompt, max_new_tokens=6, temperature=0).new_tokens
        assert row[len(prompt) :].tolist() == want
    # prompts of different lengths: the pad cannot be skipped by a recurrent state; refused in one line
    batch = tok(["def f(x", "import"], padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="cannot skip padding") as refused:
        loaded.generate(**batch, max_new_tokens=2, do_sample=False)
    assert "\n" not in str(refused.value) and "one length" in str(refused.value)


@pytest.mark.parametrize("damage", ["a flipped sum", "not json"])
def test_export_records_the_verified_checkpoint_not_a_damaged_pointer(tmp_path, capsys, damage):
    """A damaged checkpoint.json is recovered from the manifest by every reader; export read the raw pointer
    again for drmlab_run.json, so it refused a recoverable run or recorded the damaged pointer's sha256."""
    _make_run(tmp_path / "run", "GPT2")
    run = RunDir(tmp_path / "run")
    true_sha = json.loads((run.checkpoint_dir() / "manifest.json").read_text())["files"]["model.safetensors"]["sha256"]
    text = run.pointer_path.read_text()
    if damage == "a flipped sum":
        run.pointer_path.write_text(text.replace(true_sha, ("0" if true_sha[0] != "0" else "1") + true_sha[1:]))
    else:
        run.pointer_path.write_text(text[: len(text) // 2])
    out = tmp_path / "hf"
    assert main(["export", "--ckpt", str(run.path), "--out", str(out)]) == 0, capsys.readouterr().err
    record = json.loads((out / "drmlab_run.json").read_text())
    assert record["checkpoint_sha256"] == true_sha and record["step"] == 7


def _byte_chars():
    from drmlab.integrations.hf_export import byte_level_characters

    chars = byte_level_characters()
    return [chars[b] for b in range(256)]


def test_gpt2_tokenizer_export_matches_drmlab_gpt2(tmp_path, monkeypatch):
    from drmlab.integrations.hf_export import write_tokenizer
    from shared_data import find_gpt2_dir

    folder = find_gpt2_dir()
    if folder is None:
        pytest.skip("GPT-2 files (encoder.json, vocab.bpe) not available")
    monkeypatch.setenv("DRMLAB_GPT2_DIR", str(folder))
    assert "GPT-2 BPE" in write_tokenizer("gpt2", tmp_path)
    hf, ours = AutoTokenizer.from_pretrained(tmp_path), get_tokenizer("gpt2", gpt2_dir=tmp_path)
    text = "def f(x):\n\n    return x ** 2  # héllo 😀\n"
    assert hf.encode(text) == ours.encode(text) and hf.decode(hf.encode(text)) == text


def test_foreign_directories_are_refused_in_one_line(tmp_path, capsys):
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    assert main(["export", "--ckpt", str(not_a_run), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "is not a drmlab run directory" in err and len(err.strip().splitlines()) == 1
    model = _perturbed("MAMBA")
    export = tmp_path / "mamba"
    dhf.DrmlabForCausalLM.from_drmlab(model, "MAMBA", "micro", seed=3).save_pretrained(export)
    assert main(["export", "--ckpt", str(export), "--out", str(tmp_path / "x")]) == 2
    assert "is a Hugging Face model directory" in capsys.readouterr().err
    with pytest.raises(dhf.ForeignModelError, match="holds a 'drmlab-mamba' model, not 'drmlab-drm'"):
        dhf.DrmlabDRMForCausalLM.from_pretrained(export)
    foreign = tmp_path / "gpt2-hf"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    with pytest.raises(dhf.ForeignModelError, match="type 'gpt2', not a drmlab export"):
        dhf.load_pretrained(foreign)
    # an export whose recorded model settings differ from what this drmlab builds
    config = json.loads((export / "config.json").read_text())
    config["model_fields"]["d_state"] += 1
    (export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="differs from what this drmlab builds"):
        dhf.load_pretrained(export)


class _Payload:
    """A pickle that would write a marker file when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_weights_load_only_from_safetensors_never_from_a_pickle(tmp_path):
    """Before the fix, a plain pickled state dict was accepted by the Hugging Face loading path."""
    model = _perturbed("J")
    dhf.DrmlabForCausalLM.from_drmlab(model, "J", "micro", seed=3).save_pretrained(tmp_path)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "payload-ran"
    torch.save({"state": state, "payload": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(
        FileNotFoundError,
        match=r"holds no model.safetensors \(pytorch_model.bin is a pickle, "
        r"never loaded\): drmlab loads weights only from safetensors",
    ):
        dhf.load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="only from safetensors"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not marker.exists()
