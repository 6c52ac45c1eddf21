"""Studies and probes, callable from Python with plain arguments (the ``drmlab`` verbs in
:mod:`drmlab.cli` parse the command line and print; nothing here reads flags or prints).

Each study is its protocol (planning, training runs, resuming, collecting the numbers) and its
report (markdown, CSV, JSON, plots), in separate modules:

* ``ablate`` / ``ablate_report`` -- the paired multi-seed ablation and the promotion gate (docs/drm.md A.7);
* ``loop_study`` / ``loop_study_report`` -- looped arms through that protocol (docs/looped.md section 4);
* ``mqar_task``, ``mqar_models``, ``mqar`` / ``mqar_report`` -- associative recall (docs/mqar.md);
* ``compare`` -- bits per byte beside MQAR accuracy from finished studies (report only);
* ``loop_proofs`` -- the five numpy proofs of correlated accumulation (docs/looped.md section 7);
* ``inspect``, ``residual_probe`` -- one model at a time: diagnostics, residual-stream profile.

Shared: ``stats`` (mean and population std, the promotion gate) and ``plotting`` (figures on the
Agg backend; a figure that cannot be drawn never costs the tables).
"""
