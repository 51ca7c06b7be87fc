"""Stand-in of vLLM's connector stats classes (see ``vllm/__init__.py``)."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)


class KVConnectorPromMetrics:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("the device check's vLLM stand-in has no Prometheus metrics")
