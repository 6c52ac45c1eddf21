"""One loader for "a drmlab run directory or a Hugging Face export of one" (``drmlab lm-eval --ckpt DIR``).

A run directory (``checkpoint.json`` beside ``config.json``) loads through
:meth:`drmlab.runs.RunDir.load_model` (checksums verified, non-finite weights refused); an export
(``config.json`` with a ``drmlab-*`` model_type, :mod:`drmlab.integrations.hf_export`) through
:func:`drmlab.integrations.hf_models.load_pretrained`, which needs transformers. Either way the
result is the registry's ``nn.Module`` in eval mode and the drmlab tokenizer it was trained with.
A directory holding neither, or another Hugging Face model type, is refused in one line.
docs/integrations.md section 2.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class LoadedModel:
    """``model`` (the drmlab ``nn.Module``, eval mode), ``tokenizer`` (drmlab's), the registry ``name``
    and ``preset``, ``kind`` ("run" or "export") and the directory it came from."""

    model: object
    tokenizer: object
    name: str
    preset: str
    kind: str
    path: Path


def load_checkpoint_or_export(path: str | Path, device: str | None = "cpu") -> LoadedModel:
    """The model and tokenizer of the run directory or export ``path`` (see the module docstring)."""
    from drmlab.data import get_tokenizer
    from drmlab.runs import RunDir, read_json

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist or is not a directory")
    run = RunDir(path)
    if run.has_checkpoint():
        model, config, _ = run.load_model(device)
        tokenizer = get_tokenizer(config.get("tokenizer") or "bytes")
        return LoadedModel(model, tokenizer, config["model"], config["preset"], "run", path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is neither a drmlab run directory (no checkpoint.json) nor a Hugging Face export (no config.json)"
        )
    config = read_json(path / "config.json")
    if not isinstance(config, dict) or "model_type" not in config:
        raise FileNotFoundError(
            f"{path} is not a drmlab run directory (no checkpoint.json) and its config.json "
            "names no Hugging Face model_type"
        )
    from drmlab.integrations.hf_models import check_model_type, load_pretrained

    check_model_type(path)
    hf_model = load_pretrained(path, device)
    name = hf_model.config.tokenizer_name or "bytes"
    if name == "gpt2" and (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
        tokenizer = get_tokenizer("gpt2", gpt2_dir=path)
    else:
        tokenizer = get_tokenizer(name)
    return LoadedModel(
        hf_model.model.eval(), tokenizer, hf_model.config.registry_name, hf_model.config.preset, "export", path
    )
