"""``KVCacheStoreConnector``: the class vLLM loads, a facade over the side of its role.

vLLM builds one connector in its scheduler (``KVConnectorRole.SCHEDULER``) and one in each
worker (``KVConnectorRole.WORKER``). Both check the same settings and layout at start; then the
connector builds only its role's side (``SchedulerSide`` or ``WorkerSide``), and every
role-specific method asserts that side is there before handing the call to it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)

from .keys import Layout, engine_format
from .scheduler import SchedulerSide
from .settings import Settings
from .stats import KVCacheStorePromMetrics, KVCacheStoreStats
from .worker import WorkerSide

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger("vllm." + __name__)


def _tp_rank(role: KVConnectorRole) -> int:
    """The tensor-parallel rank whose blocks this connector moves: a worker's own; the
    scheduler's layout is rank 0's (it looks up every rank's keys)."""
    if role != KVConnectorRole.WORKER:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


class KVCacheStoreConnector(KVConnectorBase_V1):
    """vLLM's KV connector on the kvcache store (the package's docstring): the scheduler's or a
    worker's, by ``role``."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        settings = Settings.read(vllm_config)
        layout = Layout.of(vllm_config, kv_cache_config, _tp_rank(role))
        declared = os.environ.get("KVSTORE_BLOCK_SIZE")
        if declared and int(declared) != layout.block_size:
            raise ValueError(
                f"kvcache.vllm: the domain's block size is {declared} tokens (KVSTORE_BLOCK_SIZE) and "
                f"this engine's is {layout.block_size}: start vLLM with --block-size {declared}"
            )
        transfer = self._kv_transfer_config
        if transfer.kv_load_failure_policy != "recompute":
            logger.warning(
                "kvcache.vllm: kv_load_failure_policy is %r, so a block the store fails to deliver "
                'fails its request; set "kv_load_failure_policy": "recompute" to recompute it instead',
                transfer.kv_load_failure_policy,
            )
        logger.info(
            "kvcache.vllm %s side: %s, rank %d of %d (shard %d of %d), %s",
            role.name.lower(),
            transfer.kv_role,
            layout.tp_rank,
            layout.tp_size,
            layout.shard,
            layout.shards,
            layout.describe,
        )
        self._scheduler_side: SchedulerSide | None = None
        self._worker_side: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler_side = SchedulerSide(settings, layout, transfer)
        elif role == KVConnectorRole.WORKER:
            self._worker_side = WorkerSide(settings, layout, engine_format(vllm_config, layout))
        else:
            raise ValueError(f"kvcache.vllm: unknown connector role {role!r}")

    @property
    def scheduler_side(self) -> SchedulerSide:
        """The scheduler's side; only the scheduler's connector has one."""
        assert self._scheduler_side is not None, "kvcache.vllm: a scheduler-side call on a worker's connector"
        return self._scheduler_side

    @property
    def worker_side(self) -> WorkerSide:
        """A worker's side; only a worker's connector has one."""
        assert self._worker_side is not None, "kvcache.vllm: a worker-side call on the scheduler's connector"
        return self._worker_side

    @property
    def side(self) -> SchedulerSide | WorkerSide:
        """This connector's side, whichever its role: both have a ``link`` and ``counters``."""
        if self._scheduler_side is not None:
            return self._scheduler_side
        return self.worker_side

    # -- scheduler side ------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler_side.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler_side.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler_side.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        self.scheduler_side.set_xfer_handshake_metadata(metadata)

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker_side.start_load_kv(self._connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.worker_side.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        self.worker_side.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self.worker_side.wait_for_save(self._connector_metadata)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.worker_side.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker_side.get_block_ids_with_load_errors()

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self.worker_side.get_handshake_metadata()

    # -- both sides ----------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self.side.counters.take_stats()

    def shutdown(self) -> None:
        if self._worker_side is not None:
            self._worker_side.close()
        else:
            self.side.link.close()

    # -- vLLM's stats plumbing -----------------------------------------------------------------

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVCacheStoreStats(data=dict(data)) if data else KVCacheStoreStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return KVCacheStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
