"""drmlab in other ecosystems: Hugging Face ``transformers`` and EleutherAI's lm-evaluation-harness.

Nothing is imported here, so ``import drmlab.integrations`` is free; each module needs its extra:

* :mod:`~drmlab.integrations.hf_config` -- one ``PretrainedConfig`` per model family (``drmlab-drm``,
  ``drmlab-gpt2``, ``drmlab-llama``, ``drmlab-looped``, ``drmlab-mamba``, ``drmlab-resolvent``) that stores what the
  registry needs to rebuild the model exactly (extra ``hf``);
* :mod:`~drmlab.integrations.hf_models` -- the matching ``PreTrainedModel`` classes wrapping the
  registry's model, the decode state as ``generate()``'s cache, and the ``AutoConfig`` /
  ``AutoModelForCausalLM`` registration, which runs when the module is imported (extra ``hf``);
* :mod:`~drmlab.integrations.hf_export` -- a run directory to a Hugging Face directory (weights,
  config, tokenizer files) and the one loader of "a run directory or an export" (extra ``hf``);
* :mod:`~drmlab.integrations.lm_eval_adapter` -- the harness model ``drmlab`` (extra ``eval``).

``import drmlab.hf`` is the short public name for the first two. The page is docs/integrations.md.
"""
