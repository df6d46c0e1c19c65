"""The spyne service the tests make reliable, and what its methods did (per process).

``configure(ds=...)`` lets the XA tests hand the methods an XADataSource;
without one the methods only record in memory.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spyne import Application, Fault, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.service import delivery_context

TNS = "urn:wsrm-spyne-test"

_lock = threading.Lock()
RECORDED: list[str] = []
DELIVERIES: list[tuple[str, int]] = []  # (sequence id, message number) seen by the methods
CALLS: list[str] = []  # every call, attempts that rolled back included
_config: dict[str, Any] = {"ds": None, "node": None, "delay": 0.0, "broken": frozenset(), "calls_file": None,
                           "too_slow": frozenset()}

#: The table the methods insert into when given a data source.
SCHEMA = "CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL, node text)"


def configure(*, ds: Any = None, node: str | None = None, delay: float = 0.0, broken: Any = (),
              calls_file: str | None = None, too_slow: Any = ()) -> None:
    """``broken``: items the methods fail to process (a plain exception, not a declared fault),
    each call of them appended to ``calls_file`` (so calls are counted across processes).
    ``too_slow``: items whose query outlives its statement timeout in the database (``ds``): a
    real ``psycopg2`` OperationalError (QueryCanceled), which an outage raises too, for one
    message only."""
    _config.update(ds=ds, node=node, delay=delay, broken=frozenset(broken), calls_file=calls_file,
                   too_slow=frozenset(too_slow))


def _maybe_broken(item: str) -> None:
    if item not in _config["broken"]:
        return
    if _config["calls_file"]:
        with open(_config["calls_file"], "a", encoding="utf-8") as f:
            f.write(item + "\n")
    raise RuntimeError(f"cannot process {item}: the method has a bug")


def reset() -> None:
    with _lock:
        RECORDED.clear()
        DELIVERIES.clear()
        CALLS.clear()
    configure()


def recorded() -> list[str]:
    with _lock:
        return list(RECORDED)


def _remember(ctx: Any, item: str) -> None:
    delivery = delivery_context(ctx)
    with _lock:
        RECORDED.append(item)
        if delivery is not None:
            DELIVERIES.append((delivery.sequence_id, delivery.message_number))


def _insert(item: str) -> None:
    ds = _config["ds"]
    if ds is not None:
        with ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO orders (item, node) VALUES (%s, %s)", (item, _config["node"]))
            if item in _config["too_slow"]:
                cur.execute("SET LOCAL statement_timeout = 50")
                cur.execute("SELECT pg_sleep(2)")
    if _config["delay"]:
        time.sleep(_config["delay"])  # widen the window a crash test kills the process in


class OrderService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def record(ctx, item):
        """One-way: remember the item (and insert it when a data source is configured)."""
        _maybe_broken(item)
        _insert(item)
        if item.startswith("fail"):
            raise Fault("Server.Refused", f"the service refuses {item}")
        _remember(ctx, item)

    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, text):
        """In-out: insert (when configured), then answer, or fail for items starting 'fail'."""
        with _lock:
            CALLS.append(text)
        _insert(text)
        if text.startswith("bad"):
            raise Fault("Client.BadItem", f"{text} is not an item")
        if text.startswith("fail"):
            raise Fault("Server.Refused", f"the service refuses {text}")
        _remember(ctx, text)
        return "re:" + text


def application() -> Application:
    """A new Application each time: engaging one adds listeners to it."""
    return Application([OrderService], tns=TNS, name="OrderService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
