"""What serves requests: the OpenAI-compatible server over the bundled engine (:mod:`quantkit.engine`).

``launch.build`` loads a checkpoint and binds a :class:`server.Server`; the server hands requests to
the engine loop (:class:`scheduler.LLMEngine`: continuous batching, chunked prefill, prefix caching,
preemption), which runs each scheduled step through :func:`quantkit.engine.runner.forward_step`, the
one door into the model, and samples (:mod:`.sampling`).  Text (tokenizer, chat templates, Harmony)
is :mod:`.text`; the OpenAI request and response shapes :mod:`.protocol` and :mod:`.openai_io`;
Prometheus counters :mod:`.metrics`; sharded serving's rank driver :mod:`.distributed`.
"""
