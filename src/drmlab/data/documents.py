"""Where each document of a split starts in its token stream (what a state reset needs).

A split's stream is its documents joined by the separator (``corpus.SEPARATOR``, "\\n\\n"), which also
occurs inside documents, so no token marks a boundary. The boundaries are therefore recorded when the
stream is built, from the documents' UTF-8 lengths: document ``i`` (i >= 1) *with its leading separator*
starts at byte ``sum_{j<i} (len_j + len(sep)) - len(sep)``, the first document at 0. Its token offset is
the first token whose first byte lies at or after that byte (the bytes tokenizer: the same number; BPE:
a token that straddles the boundary stays with the document before). Starting a document at its
separator lets its first token be predicted from a fresh state that has read "\\n\\n" -- the prefix
every document follows in training and the one the lm-eval adapter uses -- so every token after the
stream's first is a target exactly once, and no target needs the document before it.
"""

from __future__ import annotations

import numpy as np

RULE = (
    "token offset of each document with its leading separator: the first token whose first byte is at or "
    "after the separator's first byte (the first document at 0)"
)


def token_byte_lengths(tokenizer, ids: np.ndarray) -> np.ndarray:
    """The UTF-8 bytes of each token of ``ids`` (int64): 1 each for the bytes tokenizer, else a table
    of ``decode_bytes([id])`` over the vocabulary."""
    ids = np.asarray(ids)
    if getattr(tokenizer, "name", None) == "bytes":
        return np.ones(ids.shape[0], dtype=np.int64)
    table = np.array([len(tokenizer.decode_bytes([i])) for i in range(tokenizer.vocab_size)], dtype=np.int64)
    return table[ids.astype(np.int64)]


def document_starts(doc_bytes: list[int], separator_bytes: int, token_bytes: np.ndarray) -> np.ndarray | None:
    """Token offsets (uint64, increasing, the first 0) of each document with its leading separator, from
    the documents' UTF-8 lengths ``doc_bytes`` and each token's bytes ``token_bytes``; None when the
    tokens' bytes do not add up to the stream's (a tokenizer that does not round-trip)."""
    lengths = np.asarray(doc_bytes, dtype=np.int64)
    stream_bytes = int(lengths.sum()) + separator_bytes * max(len(lengths) - 1, 0)
    if int(token_bytes.sum()) != stream_bytes or len(lengths) == 0:
        return None
    ends = np.cumsum(lengths + separator_bytes)  # byte after each document's separator that follows it
    byte_starts = np.concatenate([[0], ends[:-1] - separator_bytes])
    token_starts = np.concatenate([[0], np.cumsum(token_bytes)[:-1]])
    starts = np.unique(np.searchsorted(token_starts, byte_starts, side="left"))
    return starts[starts < len(token_bytes)].astype(np.uint64)
