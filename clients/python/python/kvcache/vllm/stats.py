"""What each side counts, and how the counts reach vLLM.

vLLM's connector stats (``KVCacheStoreStats``: logged as "KV Transfer metrics" and served as
``vllm:kvcache_store_*`` counters): each side counts what it does (the scheduler its lookups, a
worker its loads and saves) and hands vLLM the interval's counts, which vLLM sums across workers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import PromMetric, PromMetricT

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
    "handoffs_out",  # prefills that answered with a handoff for a remote decode
    "handoff_wait_ms",  # time prefill steps waited for the handoff's puts
    "handoff_timeouts",  # handoffs whose puts had not ended when the wait gave up
    "handoffs_in",  # decode requests that arrived with a handoff
    "handoff_blocks",  # blocks those handoffs named
    "handoff_missing_blocks",  # named blocks the store lacked, so decode computed them
    "handoff_mismatches",  # handoffs whose chain is not this replica's (other keys, other tokens)
)


class Counters:
    """Thread-safe counters of one side; ``take`` hands the interval's counts to vLLM."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._interval = dict.fromkeys(STAT_FIELDS, 0)
        self.total = dict.fromkeys(STAT_FIELDS, 0)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self._interval[k] += v
                self.total[k] += v

    def take(self) -> dict[str, int]:
        with self._lock:
            taken, self._interval = self._interval, dict.fromkeys(STAT_FIELDS, 0)
        return taken

    def take_stats(self) -> KVCacheStoreStats | None:
        """The interval's counts as vLLM's stats; ``None`` when nothing was counted."""
        taken = self.take()
        if not any(taken.values()):
            return None
        return KVCacheStoreStats(data=taken)


@dataclass
class KVCacheStoreStats(KVConnectorStats):
    """vLLM's connector stats for this connector: counts per interval, summed across workers."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = dict.fromkeys(STAT_FIELDS, 0)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k in STAT_FIELDS:
            self.data[k] = self.data.get(k, 0) + int(other.data.get(k, 0))
        return self

    def reduce(self) -> dict[str, int]:
        return {k: int(self.data.get(k, 0)) for k in STAT_FIELDS}

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in STAT_FIELDS)


class KVCacheStorePromMetrics(KVConnectorPromMetrics):
    """``vllm:kvcache_store_<count>_total`` counters, per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine

        self.counters: dict[str, dict[int, PromMetric]] = {}
        for name in STAT_FIELDS:
            c = self._counter_cls(
                name=f"vllm:kvcache_store_{name}",
                documentation=f"kvcache store connector: {name.replace('_', ' ')}",
                labelnames=labelnames,
            )
            self.counters[name] = create_metric_per_engine(c, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, per_engine in self.counters.items():
            v = int(transfer_stats_data.get(name, 0))
            if v > 0 and engine_idx in per_engine:
                per_engine[engine_idx].inc(v)
