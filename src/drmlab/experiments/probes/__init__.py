"""One model or one table at a time: ``compare`` (bits per byte beside MQAR accuracy), ``inspect``
(diagnostics of one model), ``residual`` (the residual stream at initialisation, docs/looped.md section 6)."""
