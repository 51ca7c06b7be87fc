"""Stand-in of vLLM's connector base classes (see ``vllm/__init__.py``)."""

import enum
from abc import ABC


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - a marker, as vLLM's is
    """What a scheduler hands its workers each step."""


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024 - a marker, as vLLM's is
    """What a worker hands its scheduler at start."""


class KVConnectorBase_V1(ABC):  # noqa: B024, N801 - vLLM's name
    """The connector's base: the device check never builds a connector."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("the device check's vLLM stand-in cannot run a connector")
