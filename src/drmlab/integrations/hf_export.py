"""A drmlab run directory as a Hugging Face model directory (``drmlab export``), with its tokenizer.

:func:`export_run` loads the run's committed checkpoint (checksums verified,
:meth:`drmlab.runs.RunDir.load_model`), wraps the model in its family's ``PreTrainedModel``
(:mod:`drmlab.integrations.hf_models`) and writes, into a fresh folder renamed into place at the end:

* ``config.json`` (the registry name, preset, vocabulary, seed, overrides and the model's dataclass
  config: :mod:`drmlab.integrations.hf_config`), ``generation_config.json``;
* ``model.safetensors``: the run's state dict under ``model.``, tied weights stored once (Hugging
  Face's rule: GPT2 and LLAMA keep the token embedding, the head is tied back on loading);
* the tokenizer, so that ``AutoTokenizer.from_pretrained(DIR)`` gives the ids the model was trained
  on. **bytes**: a ``tokenizer.json`` whose 256 ids are the UTF-8 byte values (a byte-level BPE
  with no merges: every byte is one token, id = byte), equal to drmlab's ``ByteTokenizer`` on every
  string. Its pad and eos token is byte 0 (NUL, spelled ``"Ā"`` in the byte-level alphabet), which
  text hardly ever holds (drmlab skips files holding NUL as binary), so ``tok(texts, padding=True)``
  works; it is matched as a token only by id, never in text (``split_special_tokens``), so a string
  holding "Ā" still encodes as its two UTF-8 bytes. **gpt2**: ``tokenizer.json`` built from the GPT-2
  files, plus the files themselves (``encoder.json``, ``vocab.bpe``) so that drmlab reads the export
  offline, with ``<|endoftext|>`` as its eos and pad token; written only when drmlab finds the files in
  a folder (``$DRMLAB_GPT2_DIR``), otherwise the export says it has no tokenizer files. The models read
  every token, so a padded batch (an ``attention_mask`` with zeros) is refused in one line by
  ``generate()`` and ``forward``; prompts of one length batch without padding;
* ``drmlab_run.json``: where the weights came from (run directory, step, tokens trained, the
  checkpoint's sha256, the run's validation numbers).

``from_pretrained`` on the result gives the run's model with bit-identical float32 logits.
docs/integrations.md shows the commands.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

EXPORT_RECORD = "drmlab_run.json"
BYTES_PAD_ID = 0  # the bytes tokenizer's pad and eos: NUL, which drmlab's corpora skip (binary files)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "encoder.json", "vocab.bpe")


class NotARunError(FileNotFoundError):
    """The directory given as a run directory is not one; the message says what it is instead."""


def byte_level_characters() -> dict[int, str]:
    """The byte-level alphabet of GPT-2 style tokenizers (Hugging Face ``tokenizers``' ``ByteLevel``):
    a printable character for each of the 256 byte values. Bytes that print as themselves (``!`` to
    ``~``, ``¡`` to ``¬``, ``®`` to ``ÿ``) keep their character; the others, in byte order, take
    U+0100, U+0101, ..."""
    kept = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    chars, shifted = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + shifted)
            shifted += 1
    return chars


def bytes_tokenizer_fast():
    """drmlab's bytes tokenizer as a ``transformers`` fast tokenizer: id = UTF-8 byte value."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_level_characters().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    nul = byte_level_characters()[BYTES_PAD_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=int(1e30),
        pad_token=nul,
        eos_token=nul,
        split_special_tokens=True,  # "Ā" in a text is two UTF-8 bytes, not the pad token
    )


def gpt2_tokenizer_fast(folder: str | Path):
    """GPT-2's BPE from ``folder/encoder.json`` and ``folder/vocab.bpe`` as a ``transformers`` fast
    tokenizer (the same ids as drmlab's tiktoken GPT-2 on ordinary text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    backend = Tokenizer(models.BPE.from_file(str(folder / "encoder.json"), str(folder / "vocab.bpe")))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=int(1e30),
    )


def write_tokenizer(tokenizer_name: str, out: Path) -> str:
    """Write the tokenizer files of drmlab tokenizer ``tokenizer_name`` into ``out``; returns what was
    written (one line, for the command's report)."""
    if tokenizer_name == "bytes":
        bytes_tokenizer_fast().save_pretrained(str(out))
        return "tokenizer.json: bytes, id = UTF-8 byte value (256 ids; pad and eos: byte 0, NUL)"
    if tokenizer_name == "gpt2":
        from drmlab.data import get_tokenizer

        origin = Path(str(get_tokenizer("gpt2").origin))
        if not ((origin / "encoder.json").is_file() and (origin / "vocab.bpe").is_file()):
            return (
                f"no tokenizer files: the GPT-2 files came from {origin}, not a folder; set DRMLAB_GPT2_DIR to "
                "a folder holding encoder.json and vocab.bpe to include them"
            )
        gpt2_tokenizer_fast(origin).save_pretrained(str(out))
        for name in ("encoder.json", "vocab.bpe"):
            shutil.copyfile(origin / name, out / name)
        return f"tokenizer.json: GPT-2 BPE (50,257 ids) from {origin}, with encoder.json and vocab.bpe"
    return f"no tokenizer files: drmlab has no tokenizer named {tokenizer_name!r}"


def _check_run(run_dir: Path):
    """The run's RunDir, or :class:`NotARunError` saying what ``run_dir`` is instead."""
    from drmlab.runs import RunDir, read_json

    if not run_dir.is_dir():
        raise NotARunError(f"{run_dir} does not exist or is not a directory")
    run = RunDir(run_dir)
    if (run_dir / "config.json").is_file() and not run.has_checkpoint():
        config = read_json(run_dir / "config.json")
        if isinstance(config, dict) and "model_type" in config:
            raise NotARunError(
                f"{run_dir} is a Hugging Face model directory (model_type {config['model_type']!r}), "
                "not a drmlab run directory: there is nothing to export"
            )
    if not (run_dir / "config.json").is_file() or not run.has_checkpoint():
        missing = [name for name in ("config.json", "checkpoint.json") if not (run_dir / name).is_file()]
        raise NotARunError(
            f"{run_dir} is not a drmlab run directory (no {' or '.join(missing)}); "
            "give the --out folder of a drmlab train"
        )
    return run


def _verified_record(run, step: int) -> dict:
    """The checkpoint record (pointer, or the manifest it was recovered from) whose weights verify, of the
    checkpoint just loaded: never the raw checkpoint.json, which may be damaged (then recovered from) or name a
    newer checkpoint committed meanwhile."""
    from drmlab.runs import MODEL_FILE, STATE_FILE

    _, record, _ = run.resolve_checkpoint(only=(MODEL_FILE, STATE_FILE))
    if record["step"] != step:
        raise ValueError(
            f"{run.path} committed the checkpoint of step {record['step']} while step {step} was exported; export again"
        )
    return record


def export_run(run_dir: str | Path, out: str | Path, *, overwrite: bool = False) -> dict:
    """Write the Hugging Face directory ``out`` for the run in ``run_dir``; returns a summary
    (model, step, files, tokenizer line). ``out`` must not exist, or be empty, or -- with
    ``overwrite`` -- hold an earlier drmlab export (nothing else is ever deleted)."""
    from drmlab.integrations.hf_models import DrmlabForCausalLM, check_model_type
    from drmlab.runs import refuse_run_output, write_json_atomic

    run_dir, out = Path(run_dir), Path(out)
    refuse_run_output(out, "--out")
    run = _check_run(run_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace an earlier export")
        if not out.is_dir() or not (out / "config.json").is_file():
            raise FileExistsError(f"{out} is not a drmlab export; refusing to replace it")
        check_model_type(out)  # only a drmlab export is replaced
    model, config, state = run.load_model("cpu")
    tokenizer_name = config.get("tokenizer") or "bytes"
    hf_model = DrmlabForCausalLM.from_drmlab(
        model,
        config["model"],
        config["preset"],
        seed=int(config["train"]["seed"]),
        overrides=config.get("overrides") or {},
        tokenizer_name=tokenizer_name,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf_model.save_pretrained(str(tmp))
        tokenizer_line = write_tokenizer(tokenizer_name, tmp)
        summary = run.read_summary() or {}
        pointer = _verified_record(run, int(state["step"]))
        record = {
            "run_dir": str(run_dir.resolve()),
            "model": config["model"],
            "preset": config["preset"],
            "overrides": config.get("overrides") or {},
            "seed": int(config["train"]["seed"]),
            "tokenizer": tokenizer_name,
            "step": int(state["step"]),
            "tokens_trained": int(state.get("tokens", 0)),
            "checkpoint_sha256": pointer["files"]["model.safetensors"]["sha256"],
            "val_ce": summary.get("val_ce"),
            "val_bpb": summary.get("val_bpb"),
        }
        write_json_atomic(tmp / EXPORT_RECORD, record)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        "out": str(out),
        "model": config["model"],
        "preset": config["preset"],
        "step": int(state["step"]),
        "model_type": hf_model.config.model_type,
        "tokenizer": tokenizer_line,
        "files": sorted(p.name for p in out.iterdir()),
    }


def read_export_record(path: str | Path) -> dict | None:
    """``drmlab_run.json`` of an export, or None when the directory has none."""
    record = Path(path) / EXPORT_RECORD
    return json.loads(record.read_text()) if record.is_file() else None
