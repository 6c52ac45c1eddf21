"""Associative recall (docs/mqar.md): ``task`` (sequences, batches, accuracy), ``models`` (widths, anchor
arms), ``study`` with ``report`` (the fixed kv protocol, sections 4-7), ``distance`` with
``distance_report`` (recall over distance, section 8)."""
