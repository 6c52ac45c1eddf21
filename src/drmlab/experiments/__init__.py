"""Studies and probes, callable from Python with plain arguments (the ``drmlab`` verbs in
:mod:`drmlab.cli` parse the command line and print; nothing here reads flags or prints).

One subpackage per study, each its protocol (planning, runs, resuming, collecting the numbers) beside
its report (markdown, CSV, JSON, plots):

* ``ablate/`` -- the paired multi-seed ablation and the promotion gate (docs/drm.md A.7);
* ``loop/`` -- looped arms through that protocol and the five proofs (docs/looped.md sections 4, 7);
* ``mqar/`` -- associative recall: the task, the models, the fixed and distance protocols (docs/mqar.md);
* ``specialise/`` -- the ASM_CM specialisation recipe (docs/mqar.md section 9);
* ``report/`` -- ``drmlab report``: one self-contained HTML page of a run or a study;
* ``probes/`` -- one model or table at a time: compare, inspect, the residual probe.

Shared by all of them: ``stats`` (mean, population std, the promotion gate), ``lr_sweep`` (each model
at its own rate) and ``plotting`` (figures on the Agg backend; a figure never costs the tables).
"""
