"""Client of the kvcache KV-cache store, for inference engines.

``Store.from_env()`` connects with exactly what the controllers inject into a replica
(``KVSTORE_LEADER``, ``KVSTORE_TENANT``, ``KVSTORE_BLOCK_SIZE``, ``KVSTORE_DTYPE``);
``Store(endpoint, tenant, block_size, dtype)`` builds one by hand. Refusals raise
``StoreError`` with the store's ``code``; batch calls answer per key with integers (bytes moved,
``KEY_NOT_FOUND``, or the negative number ``CODES`` gives for a store code).
"""

from ._native import KEY_NOT_FOUND, Store, StoreError, codes, version

#: this package's release, the store's (``kv-store --version``): both come from one build
#: protocol version its client speaks; a leader that does not serve it refuses every call with
#: CLIENT_VERSION_UNSUPPORTED
__version__, PROTOCOL = version()

#: store code -> the negative number batch calls answer with
CODES = dict(codes())
#: negative number -> store code
CODE_NAMES = {n: c for c, n in CODES.items()}

__all__ = ["Store", "StoreError", "KEY_NOT_FOUND", "CODES", "CODE_NAMES", "PROTOCOL", "__version__"]
