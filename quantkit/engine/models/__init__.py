"""Engine model files, one per family (each only wires shared layers): ``build(model_config, weights) -> CausalLM``
(:class:`quantkit.modelconfig.ModelConfig`), named by the family's ``engine`` (:mod:`quantkit.families`)."""
