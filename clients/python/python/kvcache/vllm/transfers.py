"""Moving blocks between vLLM's KV cache and the store off the engine's step.

Saves: at the end of a step (``wait_for_save``) each chunk of blocks is gathered from the cache
into a staging slot with one indexed copy per layer on the cache's device. On a GPU the gather
runs on a side stream ordered after the step's forward, the compute stream waits only for the
gather (not for the copy to the host), and the slot's device half is then copied to its pinned
host half in one copy; a thread waits for that copy's event and puts the chunk from the host.
So the step is held for a device-to-device gather, never for the host or the network.

Loads: the request waits in vLLM's ``WAITING_FOR_REMOTE_KVS`` while a thread gets its blocks:
straight into the cache's pages by pointer on a CPU, or into a pinned slot and then, on the side
stream, one copy to the device and one indexed copy per layer into the cache (the thread waits
for that event). A request is reported finished (``finished``) once every chunk is in or has
failed; failed blocks are reported with it, and vLLM recomputes them, so a failed or late load
(past the call's timeout) costs a recompute, never a wrong byte.

A prefill that hands its prompt to a remote decode waits for its request's puts at the end of the
step that completes the prompt (``wait_saved``): vLLM answers only after that step, so the
answer means the store has the blocks, and the engine frees them at once.

Slots are fixed, so memory is bounded: two for loads, and for saves as many as 512 MiB holds with
a GPU (pinned memory; a step's saves of an 8B model's 3,500-token prompt are about 430 MiB) or
two on a CPU. A step that saves more than the free slots hold waits for the oldest put to finish
(the store sets the pace).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import CODE_NAMES, KEY_NOT_FOUND, StoreError
from .link import Link
from .pages import Pages
from .stats import Counters

if TYPE_CHECKING:
    from .. import Store

logger = logging.getLogger("vllm." + __name__)

#: what a transfer may add to the timeout per byte it moves: 1 s per 256 MB
SECONDS_PER_BYTE = 1 / 256e6
#: bytes a slot holds when ``staging_blocks`` is not set
SLOT_BYTES = 64 << 20
#: staging slots for loads, and for saves on a CPU
SLOTS = 2
#: pinned bytes for saves in flight with a GPU
SAVE_BYTES_GPU = 512 << 20


@dataclass
class Slot:
    """One chunk's staging memory: on the host (pinned with a GPU), and on the device with one."""

    host: torch.Tensor
    device: torch.Tensor | None


@dataclass
class _Chunk:
    req_id: str
    keys: list[str]
    blocks: list[int]


class Transfers:
    """The worker's background movers: one thread for saves, one for loads, each with its slots."""

    def __init__(self, pages: Pages, link: Link, counters: Counters, timeout_ms: int, chunk_blocks: int, direct: bool):
        self.pages = pages
        self.link = link
        self.counters = counters
        self.timeout_ms = timeout_ms
        self.chunk = chunk_blocks
        #: loads go straight into the cache by pointer (a CPU cache), not through slots
        self.direct = direct
        self.cuda = pages.device.type == "cuda"
        #: side streams, one per direction, so a load's scatter never delays a save's gather
        self.streams = {d: torch.cuda.Stream(pages.device) for d in ("save", "load")} if self.cuda else {}
        size = chunk_blocks * pages.value_bytes
        counts = {"save": max(SLOTS, SAVE_BYTES_GPU // size) if self.cuda else SLOTS, "load": SLOTS}
        self._slots: dict[str, queue.Queue[Slot]] = {}
        self.slots: list[Slot] = []
        for direction in ("save", "load"):
            q: queue.Queue[Slot] = queue.Queue()
            for _ in range(counts[direction]):
                slot = Slot(
                    torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda),
                    torch.empty(size, dtype=torch.uint8, device=pages.device) if self.cuda else None,
                )
                self.slots.append(slot)
                q.put(slot)
            self._slots[direction] = q
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        #: save chunks queued or running, by request
        self._saving: dict[str, int] = {}
        self._saved = threading.Condition(self._lock)
        self._finished: set[str] = set()
        self._failed: set[int] = set()
        self._work: dict[str, queue.Queue[Any]] = {"save": queue.Queue(), "load": queue.Queue()}
        self._threads = [
            threading.Thread(target=self._run, args=(self._work["save"], self._put), name="kvcache-save", daemon=True),
            threading.Thread(target=self._run, args=(self._work["load"], self._get), name="kvcache-load", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def memory(self) -> list[tuple[int, int]]:
        """What a connection must have registered: the slots' host memory, and the cache's
        when loads go straight into it."""
        spans = [(s.host.data_ptr(), s.host.numel()) for s in self.slots]
        return spans + (self.pages.memory() if self.direct else [])

    # -- saves ---------------------------------------------------------------------------------

    def save(self, req_id: str, keys: list[str], blocks: list[int]) -> None:
        """Gathers `blocks` now (ordered after the step's forward on a GPU) and puts them under
        `keys` on the save thread."""
        for at in range(0, len(keys), self.chunk):
            c = _Chunk(req_id, keys[at : at + self.chunk], blocks[at : at + self.chunk])
            slot = self._slots["save"].get()
            n = len(c.blocks)
            ids = torch.tensor(c.blocks, dtype=torch.int64, device=self.pages.device)
            event = None
            if self.cuda and slot.device is not None:
                stream = self.streams["save"]
                main = torch.cuda.current_stream(self.pages.device)
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    self.pages.gather(ids, slot.device[: n * self.pages.value_bytes])
                    gathered = torch.cuda.Event()
                    gathered.record(stream)
                    slot.host[: n * self.pages.value_bytes].copy_(
                        slot.device[: n * self.pages.value_bytes], non_blocking=True
                    )
                    event = torch.cuda.Event()
                    event.record(stream)
                # the forward of the next step may overwrite these blocks: only after the gather
                main.wait_event(gathered)
            else:
                self.pages.gather(ids, slot.host[: n * self.pages.value_bytes])
            with self._lock:
                self._saving[req_id] = self._saving.get(req_id, 0) + 1
            self._work["save"].put((c, slot, event))

    def wait_saved(self, req_ids: list[str]) -> bool:
        """Waits until every save chunk of `req_ids` queued so far has been put (or failed);
        `False` if they have not within the time their calls may take."""
        chunk_s = self.timeout_ms / 1000 + self.chunk * self.pages.value_bytes * SECONDS_PER_BYTE
        with self._saved:
            queued = sum(self._saving.values())
            return self._saved.wait_for(
                lambda: all(self._saving.get(r, 0) == 0 for r in req_ids), timeout=(queued + 1) * chunk_s
            )

    def _put(self, item: tuple[_Chunk, Slot, Any]) -> None:
        c, slot, event = item
        try:
            if event is not None:
                event.synchronize()
            n, base = len(c.blocks), slot.host.data_ptr()
            parts = [self.pages.staged(base, n, j) for j in range(n)]
            done = self._call("a save", lambda s, t: s.batch_put_from_parts(c.keys, *_split(parts), timeout_ms=t), n)
            stored = sum(1 for d in done if d == 0)
            if stored < n:
                codes = sorted({CODE_NAMES.get(d, str(d)) for d in done if d != 0})
                logger.warning("kvcache.vllm: %d of %d blocks were not saved (%s)", n - stored, n, ", ".join(codes))
            value = self.pages.value_bytes
            self.counters.add(saved_blocks=stored, saved_bytes=stored * value, save_failures=n - stored)
        finally:
            self._slots["save"].put(slot)
            with self._saved:
                left = self._saving.get(c.req_id, 1) - 1
                if left:
                    self._saving[c.req_id] = left
                else:
                    self._saving.pop(c.req_id, None)
                self._saved.notify_all()

    # -- loads ---------------------------------------------------------------------------------

    def load(self, req_id: str, keys: list[str], blocks: list[int]) -> None:
        """Gets `keys` into `blocks` on the load thread; `finished` reports `req_id` once all
        of them are in or failed."""
        ready = None
        if self.cuda:
            # ordered after whatever the compute stream has queued so far
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.pages.device))
        chunks = [
            _Chunk(req_id, keys[at : at + self.chunk], blocks[at : at + self.chunk])
            for at in range(0, len(keys), self.chunk)
        ]
        with self._lock:
            self._pending[req_id] = self._pending.get(req_id, 0) + len(chunks)
        for c in chunks:
            self._work["load"].put((c, ready))

    def _get(self, item: tuple[_Chunk, Any]) -> None:
        c, ready = item
        n, value = len(c.blocks), self.pages.value_bytes
        got: list[int] = [-1] * n
        try:
            if self.direct:
                parts = [self.pages.pointers(b) for b in c.blocks]
                got = self._call("a load", lambda s, t: s.batch_get_into_parts(c.keys, *_split(parts), timeout_ms=t), n)
            else:
                got = self._get_staged(c, ready)
        finally:
            ok = [answer == value for answer in got]
            self._count_loads(c, got, ok)

    def _get_staged(self, c: _Chunk, ready: Any) -> list[int]:
        slot = self._slots["load"].get()
        try:
            n, base, value = len(c.blocks), slot.host.data_ptr(), self.pages.value_bytes
            parts = [self.pages.staged(base, n, j) for j in range(n)]
            got = self._call("a load", lambda s, t: s.batch_get_into_parts(c.keys, *_split(parts), timeout_ms=t), n)
            keep = [j for j in range(n) if got[j] == value]
            if not keep:
                return got
            host = slot.host[: n * value]
            if self.cuda and slot.device is not None:
                stream = self.streams["load"]
                torch.cuda.set_device(self.pages.device)
                with torch.cuda.stream(stream):
                    stream.wait_event(ready)
                    staged = slot.device[: n * value]
                    staged.copy_(host, non_blocking=True)
                    self._scatter(c.blocks, keep, staged, n)
                    done = torch.cuda.Event()
                    done.record(stream)
                done.synchronize()
            else:
                self._scatter(c.blocks, keep, host, n)
            return got
        finally:
            self._slots["load"].put(slot)

    def _scatter(self, blocks: list[int], keep: list[int], staged: torch.Tensor, n: int) -> None:
        """Copies the chunk's rows `keep` (of `n`, laid out as `Pages.gather` fills them) into
        their blocks."""
        device = self.pages.device
        if len(keep) < n:
            rows = staged.view(len(self.pages.layers), n, self.pages.page_bytes)
            staged = rows[:, torch.tensor(keep, device=device)].contiguous().view(-1)
        ids = torch.tensor([blocks[j] for j in keep], dtype=torch.int64, device=device)
        self.pages.scatter(ids, staged)

    def _count_loads(self, c: _Chunk, got: list[int], ok: list[bool]) -> None:
        failed = [b for b, good in zip(c.blocks, ok) if not good]
        loaded = len(c.blocks) - len(failed)
        if failed:
            value = self.pages.value_bytes
            codes = sorted(
                {CODE_NAMES.get(a, "KEY_NOT_FOUND" if a == KEY_NOT_FOUND else str(a)) for a in got if a != value}
            )
            logger.warning(
                "kvcache.vllm: %d of %d blocks did not load (%s); vLLM recomputes them",
                len(failed),
                len(c.blocks),
                ", ".join(codes),
            )
        self.counters.add(loaded_blocks=loaded, loaded_bytes=loaded * self.pages.value_bytes, load_failures=len(failed))
        with self._lock:
            self._failed.update(failed)
            self._pending[c.req_id] -= 1
            if self._pending[c.req_id] == 0:
                del self._pending[c.req_id]
                self._finished.add(c.req_id)

    def finished(self) -> tuple[set[str], set[int]]:
        """Requests whose loads have all ended since the last call, and every block that failed
        to load since then (those of the requests reported, at least)."""
        with self._lock:
            done, self._finished = self._finished, set()
            failed, self._failed = self._failed, set()
        return done, failed

    def idle(self) -> bool:
        """Whether no transfer is queued or running."""
        with self._lock:
            loading = bool(self._pending)
        return not loading and all(q.unfinished_tasks == 0 for q in self._work.values())

    # -- both ----------------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[Store, int], list[int]], n: int) -> list[int]:
        """`call` on the store with the link's timeout plus the time `n` values may take; -1
        for each value when there is no store to call or the call failed (logged and counted)."""
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1)
            return [-1] * n
        timeout = self.timeout_ms + int(n * self.pages.value_bytes * SECONDS_PER_BYTE * 1000)
        try:
            return call(store, timeout)
        except StoreError as e:
            self.link.failed(e, what)
            return [-1] * n

    def _run(self, work: queue.Queue[Any], handle: Callable[[Any], None]) -> None:
        while True:
            item = work.get()
            try:
                if item is None:
                    return
                handle(item)
            except Exception:  # noqa: BLE001 - a mover never dies; the failure is counted
                logger.exception("kvcache.vllm: a transfer failed")
            finally:
                work.task_done()

    def close(self) -> None:
        """Stops the movers once what is queued has run."""
        for q in self._work.values():
            q.put(None)
        for t in self._threads:
            t.join(timeout=30)


def _split(parts: list[tuple[list[int], list[int]]]) -> tuple[list[list[int]], list[list[int]]]:
    return [p for p, _ in parts], [s for _, s in parts]
