"""What a caller knows of a run that config.json records beside the model and the train settings
(docs/guide.md section 4, "What a run records"): the model's name and preset, its overrides, the data and, for a study,
its own record. One typed value instead of a dict built by hand at every call of ``train``."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DataInfo:
    """The training data of a run: the tokenizer's vocabulary and name, the source the user named
    (None: the embedded corpus) and the corpus's provenance (``Corpus.meta``: content sha256, sizes)."""

    vocab_size: int
    tokenizer: str
    source: str | None
    meta: Any

    @classmethod
    def of(cls, corpus, source: str | None) -> DataInfo:
        return cls(corpus.vocab_size, corpus.tokenizer.name, source, corpus.meta)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """config.json's caller part. ``label`` names a study's arm when it differs from the registry
    name; ``registry_model`` is the registry entry a study built; ``study`` holds a study's own record
    (for example ``{"mqar": task}``), written after the data in its given order."""

    model: str | None = None  # None: the model's own name (``model.model_name`` or its class)
    preset: str | None = None
    overrides: dict = dataclasses.field(default_factory=dict)
    label: str | None = None
    registry_model: str | None = None
    data: DataInfo | None = None
    study: dict = dataclasses.field(default_factory=dict)

    def record(self) -> dict:
        """The entries of config.json, in the order config.json has always had them."""
        out: dict = {} if self.model is None else {"model": self.model, "preset": self.preset}
        out["overrides"] = self.overrides
        if self.label is not None:
            out["label"] = self.label
        if self.registry_model is not None:
            out["registry_model"] = self.registry_model
        if self.data is not None:
            out |= {
                "vocab_size": self.data.vocab_size,
                "tokenizer": self.data.tokenizer,
                "data_source": self.data.source,
                "data": self.data.meta,
            }
        clash = set(self.study) & set(out)
        if clash:
            raise ValueError(f"RunInfo.study repeats the run's own entries: {sorted(clash)}")
        return out | self.study
