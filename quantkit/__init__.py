"""quantkit: requantize, shard, verify and serve open-weight MoE checkpoints."""

__version__ = "0.1.0"
