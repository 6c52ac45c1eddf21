"""The looped-residual study (docs/looped.md): ``study`` with ``report`` (arms through the paired
protocol, section 4) and ``proofs/`` (the five numerical proofs, section 7)."""
