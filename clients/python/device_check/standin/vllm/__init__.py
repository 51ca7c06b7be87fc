"""A stand-in for the few vLLM names ``kvcache.vllm`` imports when its modules load, for the
device check (``scripts/device-check``), which runs where vLLM cannot be installed. It holds no
vLLM code: only the base classes the connector's modules subclass, with their fields. Anything
else the connector reaches for (``Layout.of``, ``engine_format``) is vLLM's own and is not
called by the device check."""
