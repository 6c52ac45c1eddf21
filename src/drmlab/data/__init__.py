"""Corpora and tokenizers.

``load_corpus`` turns a source (by default the running interpreter's standard library) into
audited train/validation token streams cached as verified memmapped shards; ``get_tokenizer``
gives the byte tokenizer (vocabulary 256, the default) or GPT-2 BPE (tiktoken, offline from local
files). Modules: ``sources`` (reading text), ``audit`` (split and contamination audit),
``tokenizers``, ``shards`` (cache files), ``corpus`` (the pipeline).
"""

from .corpus import DEFAULT_VAL_FRACTION, TokenCorpus, cache_root, load_corpus
from .shards import CorruptShardError
from .tokenizers import ByteTokenizer, TiktokenTokenizer, Tokenizer, get_tokenizer

__all__ = [
    "DEFAULT_VAL_FRACTION",
    "ByteTokenizer",
    "CorruptShardError",
    "TiktokenTokenizer",
    "TokenCorpus",
    "Tokenizer",
    "cache_root",
    "get_tokenizer",
    "load_corpus",
]
