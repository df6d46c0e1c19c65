"""Reply callbacks the examples name by import path (``"replies:on_reply"``).

A callback is stored with the request as an import path, not as a function,
so that the process that receives the reply (possibly after a restart) can
find it again (seed 004, 4.2.2: "Mercury can create an instance of callback").
It runs in the client engine's invoker thread, inside the delivery's
transaction: raising makes the reply be delivered again.

The examples run with ``examples/`` as the script directory, so this module
is importable as ``replies``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from interceptors.zeep_client.client import ReliableReply


@dataclass(frozen=True)
class Received:
    user_context: str | None
    result: object
    fault: str | None
    sequence_id: str


RECEIVED: list[Received] = []
_lock = threading.Lock()


def on_reply(reply: ReliableReply) -> None:
    """Remember a reply or a fault, and the WS-RM sequence it travelled on."""
    received = Received(reply.user_context, reply.result,
                        None if reply.fault is None else str(reply.fault), reply.context.sequence_id)
    with _lock:
        RECEIVED.append(received)


def received() -> list[Received]:
    with _lock:
        return list(RECEIVED)
