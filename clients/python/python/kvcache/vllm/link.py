"""The store connection each side holds, and how it fails.

A store that is down, slow (``timeout_ms``, default 2000) or refusing never stops the engine: the
lookup answers 0, a failed load reports its blocks to vLLM, which recomputes them
(``kv_load_failure_policy: recompute``, which injection sets), a failed save is dropped, and
every such call is counted. After a failure the store is left alone for ``retry_interval_s``
(default 5) so a dead store costs one timeout per interval, not one per request; connecting
happens on a background thread for the same reason.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from .. import Store, StoreError, __version__
from .keys import Layout
from .settings import Settings

logger = logging.getLogger("vllm." + __name__)

#: keys per store call: a long prompt of a deep model names tens of thousands of values, more
#: than one metadata frame carries
KEYS_PER_CALL = 4096


class Link:
    """The store connection, shared by the calls of one side: opened on a background thread
    (a store that does not answer never blocks the engine), and left alone for
    ``retry_interval_s`` after a call failed."""

    def __init__(self, settings: Settings, block_size: int, dtype: str):
        self.settings = settings
        self.block_size = block_size
        self.dtype = dtype
        self.store: Store | None = None
        self._until = 0.0
        self._lock = threading.Lock()
        self._connecting = False
        self._warned: set[tuple[str, str]] = set()
        #: called with each new connection, under the link's lock
        self.on_connect: list[Callable[[Store], None]] = []

    @staticmethod
    def of(settings: Settings, layout: Layout) -> Link:
        """The connection to the domain of this layout's blocks (``KVSTORE_DTYPE`` names the
        domain's dtype when injection gives it)."""
        return Link(settings, layout.block_size, os.environ.get("KVSTORE_DTYPE") or layout.dtype)

    def _open(self) -> Store:
        s = self.settings
        options = {"timeout_ms": s.timeout_ms, "same_host": s.same_host}
        if not s.endpoint:
            store = Store.from_env(**options)
        else:
            tenant = s.tenant or os.environ.get("KVSTORE_TENANT") or "default"
            store = Store(
                s.endpoint,
                tenant,
                self.block_size,
                self.dtype,
                credential=os.environ.get("KVSTORE_CREDENTIAL", ""),
                client=os.environ.get("KVSTORE_CLIENT", ""),
                **options,
            )
        # the store's refusals of this tenant or layout surface now, in the log, once
        store.is_exist("kvcache/attach-probe")
        return store

    def _connect(self) -> None:
        store: Store | None
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

    def attach(self, f: Callable[[Store], None]) -> None:
        """Calls `f` with the connection now if there is one, and with every new one."""
        with self._lock:
            self.on_connect.append(f)
            if self.store is not None:
                f(self.store)

    def start(self) -> None:
        """Connects in the background."""
        with self._lock:
            if self.store is None and not self._connecting:
                self._connecting = True
                threading.Thread(target=self._connect, name="kvcache-connect", daemon=True).start()

    def get(self) -> Store | None:
        """The store to call now, or ``None`` (not connected yet, or backing off after a failure)."""
        now = time.monotonic()
        with self._lock:
            store, until = self.store, self._until
        if store is None:
            if now >= until:
                self.start()
            return None
        return store if now >= until else None

    def _failed(self, e: StoreError, what: str) -> None:
        code = getattr(e, "code", "INTERNAL")
        self._until = time.monotonic() + self.settings.retry_interval_s
        level = logging.WARNING if code in ("TRANSPORT", "NOT_SERVING") else logging.ERROR
        if (code, what) not in self._warned or level == logging.WARNING:
            self._warned.add((code, what))
            logger.log(
                level,
                "kvcache.vllm: %s failed (%s); the engine recomputes, and the store is left alone for %.0f s: %s",
                what,
                code,
                self.settings.retry_interval_s,
                e,
            )

    def failed(self, e: StoreError, what: str) -> None:
        with self._lock:
            self._failed(e, what)

    def close(self) -> None:
        """Closes the connection (the engine is shutting down)."""
        store, self.store = self.store, None
        if store is not None:
            store.close()
