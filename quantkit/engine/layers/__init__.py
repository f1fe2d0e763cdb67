"""Shared layers every model file wires: RMSNorm (``norm``), RoPE incl. YaRN (``rope``), GQA
attention with sinks and sliding windows (``attention``), DeepSeek MLA (``mla``), the dense SwiGLU
MLP (``mlp``) and mixture of experts with the three routing rules (``moe``).  Every projection is a
:class:`quantkit.engine.qlinear.Linear`; no layer touches quantized math itself."""
