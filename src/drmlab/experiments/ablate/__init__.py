"""The paired ablation (docs/drm.md section A.7): ``protocol`` plans, trains and collects; ``report`` writes it."""
