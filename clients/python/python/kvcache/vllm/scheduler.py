"""The scheduler side: what to load from the store and what to save to it.

One ``batch_is_exist`` per new request over every prompt block's keys (of every shard; it also
leases them, so they are not evicted before the load); the hit is the run of whole blocks present
after vLLM's own prefix-cache hit, loaded asynchronously: the request waits in
``WAITING_FOR_REMOTE_KVS`` until the workers report it loaded. Blocks the store lacks are saved
once vLLM has computed them. The scheduler never moves a byte: each step it hands the workers a
``KVCacheStoreMetadata`` of the blocks to load and to save. The shards' namespaces need the
workers' page format, which vLLM's handshake brings (``set_xfer_handshake_metadata``); until it
has, or if the workers disagree on it, every lookup is a miss. Prefill and decode replicas hand a
prompt over through the store (``handoff``): a prefill asked for it marks the step that completes
the prompt, so its workers end that step only once the prompt's puts have, and answers with the
handoff; a decode handed one checks its own chain against it and counts what the store lacked.
With ``KVSTORE_REPORT=stdout`` it prints one JSON line per finished request at most every
``KVSTORE_REPORT_INTERVAL`` seconds (default 1) with the cumulative ``blocks``, ``hits``,
``stored`` and ``hit_rate``, which the local runtime reads.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import StoreError
from .handoff import Handoff, fingerprint, requested
from .keys import Layout, block_key, chain, request_seed
from .link import KEYS_PER_CALL, Link
from .metadata import KVCacheStoreMetadata, Transfer
from .settings import Settings
from .stats import Counters

logger = logging.getLogger("vllm." + __name__)

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class _Tracked:
    """The scheduler's view of one request."""

    hashes: list[str]
    #: per prompt block: held by the store at lookup time (the block of every rank)
    present: list[bool]
    block_ids: list[int] = field(default_factory=list)
    #: blocks below this are stored, being stored, or not to be stored
    saved_upto: int = 0
    #: local prefix-cache hit in blocks, from the last lookup
    local_blocks: int = 0
    hit_blocks: int = 0
    #: a prefill for a remote decode: hand the prompt over through the store
    hand_over: bool = False
    #: the step completing the prompt was marked, so its puts are waited for
    handed: bool = False


class SchedulerSide:
    """The scheduler's half of the connector: its own connection (lookups only) and counters."""

    def __init__(self, settings: Settings, layout: Layout, transfer_config: KVTransferConfig):
        self.settings = settings
        self.layout = layout
        self.model = settings.model
        self.producer = transfer_config.is_kv_producer
        self.consumer = transfer_config.is_kv_consumer
        self.counters = Counters()
        self.link = Link.of(settings, layout)
        #: requests seen, by id: ``None`` for one served without the cache
        self._requests: dict[str, _Tracked | None] = {}
        #: each shard's namespace, once the workers' page format is known
        self._namespaces: list[str] | None = None
        #: loads planned since the last step's metadata
        self._loads: list[Transfer] = []
        #: loads not yet reported finished, by request: (first block, transfer)
        self._loading: dict[str, tuple[int, Transfer]] = {}
        self._last_report = 0.0
        self._reported: dict[str, Any] = {}
        self._saved_total = 0
        self.link.start()

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        """The workers' page formats, by rank: one namespace per shard when they agree."""
        formats = {getattr(m, "page_format", None) for m in metadata.values()}
        if len(formats) != 1 or None in formats or len(metadata) != self.layout.tp_size:
            logger.error(
                "kvcache.vllm: the %d ranks' page formats differ or are missing (%s); the cache is off",
                self.layout.tp_size,
                sorted(map(str, formats)),
            )
            self._namespaces = None
            return
        (page_format,) = formats
        self._namespaces = [self.layout.namespace(self.model, page_format, s) for s in range(self.layout.shards)]
        logger.info("kvcache.vllm scheduler: keys under %s", self._namespaces[0])

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if request.request_id not in self._requests:
            # one lookup per request: vLLM may ask again while the request waits
            tracked = self._lookup(request)
            self._requests[request.request_id] = tracked
            if tracked is not None:
                tracked.hand_over = self.producer and requested(request)
                self._received(request, tracked)
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
        external = max(0, hit * self.layout.block_size - num_computed_tokens)
        return external, external > 0

    def _lookup(self, request: Request) -> _Tracked | None:
        seed = request_seed(request, self.model)
        if seed is None:
            self.counters.add(uncacheable=1)
            return None
        blocks = request.num_prompt_tokens // self.layout.block_size
        hashes = chain(seed, request.prompt_token_ids, self.layout.block_size, blocks)
        tracked = _Tracked(hashes=hashes, present=[False] * blocks)
        if not blocks:
            return tracked
        store = self.link.get()
        if store is None or self._namespaces is None:
            self.counters.add(skipped=1)
            return tracked
        keys = [block_key(ns, h) for h in hashes for ns in self._namespaces]
        try:
            found = [
                f
                for at in range(0, len(keys), KEYS_PER_CALL)
                for f in store.batch_is_exist(keys[at : at + KEYS_PER_CALL])
            ]
        except StoreError as e:
            self.link.failed(e, "a lookup")
            self.counters.add(lookup_failures=1)
            return tracked
        per_block = self.layout.shards
        tracked.present = [all(found[i * per_block : (i + 1) * per_block]) for i in range(blocks)]
        self.counters.add(lookups=1, lookup_blocks=blocks)
        return tracked

    def _received(self, request: Request, tracked: _Tracked) -> None:
        """Counts a decode request's handoff: the blocks it names, those the store lacks (the
        engine computes them), and a chain that is not this replica's."""
        handoff = Handoff.of(request)
        if handoff is None:
            return
        loadable = (request.num_prompt_tokens - 1) // self.layout.block_size
        named = min(handoff.blocks, loadable, len(tracked.present))
        held = 0
        while held < named and tracked.present[held]:
            held += 1
        ours = (
            self._namespaces is not None
            and 0 < handoff.blocks <= len(tracked.hashes)
            and fingerprint(self._namespaces, tracked.hashes[handoff.blocks - 1]) == handoff.fingerprint
        )
        mismatch = handoff.blocks > 0 and not ours
        if mismatch:
            logger.warning(
                "kvcache.vllm: request %s was handed %d blocks of a chain that is not this replica's "
                "(another model, layout, salt or LoRA, or other tokens); it computes what it cannot find",
                request.request_id,
                handoff.blocks,
            )
        if held < named:
            logger.info(
                "kvcache.vllm: request %s was handed %d blocks, the store holds the first %d; it computes the rest",
                request.request_id,
                named,
                held,
            )
        self.counters.add(
            handoffs_in=1, handoff_blocks=named, handoff_missing_blocks=named - held, handoff_mismatches=int(mismatch)
        )

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        tracked = self._requests.get(request.request_id)
        if tracked is None or num_external_tokens <= 0:
            return
        first, n = tracked.local_blocks, num_external_tokens // self.layout.block_size
        ids = list(blocks.get_block_ids()[0])[first : first + n]
        if len(ids) != n:  # pragma: no cover - vLLM allocates every block it asked for
            raise RuntimeError(f"kvcache.vllm: {n} blocks to load for {request.request_id}, {len(ids)} allocated")
        transfer = Transfer(request.request_id, tracked.hashes[first : first + n], ids)
        self._loads.append(transfer)
        self._loading[request.request_id] = (first, transfer)
        tracked.saved_upto = max(tracked.saved_upto, first + n)
        self.counters.add(hit_blocks=n)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVCacheStoreMetadata:
        meta = KVCacheStoreMetadata(loads=self._loads)
        self._loads = []
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
                # preempted and resumed: these are all of its blocks now
                tracked.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                tracked.block_ids.extend(new_ids[0])
            computed = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan(meta, req_id, tracked, computed)
        return meta

    def _plan(self, meta: KVCacheStoreMetadata, req_id: str, tracked: _Tracked, computed: int) -> None:
        if not self.producer:
            return
        done = min(computed // self.layout.block_size, len(tracked.hashes), len(tracked.block_ids))
        if tracked.hand_over and not tracked.handed and done >= len(tracked.hashes):
            # this step completes the prompt: it ends once the prompt's puts have, before vLLM answers
            meta.handoffs.append(req_id)
            tracked.handed = True
        if done <= tracked.saved_upto:
            return
        todo = [i for i in range(tracked.saved_upto, done) if not tracked.present[i]]
        tracked.saved_upto = done
        if todo:
            meta.saves.append(Transfer(req_id, [tracked.hashes[i] for i in todo], [tracked.block_ids[i] for i in todo]))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        stats = getattr(connector_output, "kv_connector_stats", None)
        if stats is not None and getattr(stats, "data", None):
            self._saved_total += int(stats.data.get("saved_blocks", 0))
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        if invalid:
            self._forget_failed(invalid)
        for req_id in getattr(connector_output, "finished_recving", None) or ():
            self._loading.pop(req_id, None)

    def _forget_failed(self, invalid: set[int]) -> None:
        """A load that failed is never offered again: vLLM recomputes its request from the first
        failed block and asks again, and the blocks from there on count as absent (else the same
        load would fail again, forever), so they are saved anew once recomputed."""
        for req_id, (first, transfer) in self._loading.items():
            failed = [i for i, block in enumerate(transfer.block_ids) if block in invalid]
            tracked = self._requests.get(req_id)
            if failed and tracked is not None:
                at = first + failed[0]
                tracked.present[at:] = [False] * (len(tracked.present) - at)
                tracked.saved_upto = min(tracked.saved_upto, at)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        tracked = self._requests.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        self._report()
        if not (self.producer and requested(request)):
            return False, None
        # the blocks are in the store (or failed to be): vLLM frees them at once
        self.counters.add(handoffs_out=1)
        return False, self._handoff(tracked).params(request.prompt_token_ids)

    def _handoff(self, tracked: _Tracked | None) -> Handoff:
        """What a prefill hands over: every full prompt block, once the step completing the
        prompt waited for their puts; nothing when it never got there (or keys nothing)."""
        if tracked is None or not tracked.handed or self._namespaces is None or not tracked.hashes:
            return Handoff(0, 0, "")
        blocks = len(tracked.hashes)
        value = self.layout.page_bytes * len(self.layout.layers) * self.layout.shards
        return Handoff(blocks, blocks * value, fingerprint(self._namespaces, tracked.hashes[-1]))

    def _report(self) -> None:
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
