"""A zeep transport that keeps the service's WSDL in the client's store: a restart without the server.

A reliable client exists so that calls survive a server that is down.  But
``zeep.Client(url)`` reads the WSDL (and the schemas it imports) from the
server before anything else, so a client restarting while the server is down
could not even be built, and the messages waiting in its store would wait for
a human.  :class:`StoredWsdlTransport` fetches every document from the
network as usual and keeps a copy of each in the store; when the server
cannot be reached (connection refused, timeout, or a 5xx answer) it serves
the last copy instead, with a warning::

    transport = StoredWsdlTransport("sqlite:///client.db")
    client = zeep.Client("http://orders.example/?wsdl", transport=transport)
    rc = reliable_client(client, store="sqlite:///client.db", key="orders")

Why the store and not a file or zeep's own cache: the store is the one
durable place a reliable client is already configured with (and shared by
the processes of a client with a PostgreSQL store); zeep's caches answer
from the cache first, so a changed WSDL would not be seen while the server
is up.  Here the network wins whenever it answers.

The copies live in a table of their own, ``wsrm_wsdl_document``, created on
first use: it is a cache, not state, so it stays out of the store's schema
migrations (dropping it loses nothing a running server cannot give back).
With a ``memory:`` store the copies live as long as the store object.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import requests
import zeep

from wsrm_plugin.store import StorageManager, open_store
from wsrm_plugin.store.sql import SqlTransaction

__all__ = ["StoredWsdlTransport", "WsdlUnavailableError"]

log = logging.getLogger(__name__)

_TABLE = "wsrm_wsdl_document"

#: Copies kept for stores without SQL (memory:), per store object.
_memory_copies: weakref.WeakKeyDictionary[Any, dict[str, tuple[bytes, float]]] = weakref.WeakKeyDictionary()
_memory_lock = threading.Lock()


class WsdlUnavailableError(requests.ConnectionError):
    """The document could not be fetched and no copy of it was ever stored."""


class StoredWsdlTransport(zeep.Transport):
    """``zeep.Transport`` whose WSDL/XSD downloads are kept in ``store`` and served from it when offline.

    ``store`` is a store URL (opened here and closed by :meth:`close`) or an
    open :class:`~wsrm_plugin.store.StorageManager` (the caller's).  The
    other keyword arguments are zeep's (``session``, ``timeout``...).
    """

    def __init__(self, store: str | StorageManager, **transport_options: Any) -> None:
        super().__init__(**transport_options)
        self._owns_store = isinstance(store, str)
        self.store: StorageManager = open_store(store) if isinstance(store, str) else store
        self._table_ready = False

    # -- zeep's hook: every WSDL and XSD document read over the network comes through here ------

    def _load_remote_data(self, url: str) -> bytes:
        if not url.lower().startswith(("http://", "https://")):
            return super()._load_remote_data(url)
        try:
            content = super()._load_remote_data(url)
        except (requests.ConnectionError, requests.Timeout) as exc:
            return self._stored_copy(url, exc)
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status < 500:  # the server answered that the document is not there: no stale copy
                raise
            return self._stored_copy(url, exc)
        try:
            self.put(url, content)
        except Exception:  # the copy is an extra: a store that cannot take it must not stop the client
            log.warning("could not keep a copy of %s in %s", url, self.store, exc_info=True)
        return content

    def _stored_copy(self, url: str, exc: BaseException) -> bytes:
        stored = self.stored_copy(url)
        if stored is None:
            raise WsdlUnavailableError(
                f"cannot fetch {url} ({exc}) and {self.store} holds no copy of it: the first start of "
                "a client needs its server up (or a local copy of the WSDL)") from exc
        content, fetched_at = stored
        log.warning("cannot fetch %s (%s); using the copy kept in %s on %s", url, exc, self.store,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fetched_at)))
        return content

    # -- the copies ---------------------------------------------------------------------------------

    def stored_copy(self, url: str) -> tuple[bytes, float] | None:
        """The stored copy of ``url`` and when it was fetched, or None."""
        with self.store.begin() as tx:
            if not isinstance(tx, SqlTransaction):
                with _memory_lock:
                    return _memory_copies.get(self.store, {}).get(url)
            self._ensure_table(tx)
            row = tx.one(f"SELECT content, fetched_at FROM {_TABLE} WHERE url = ?", (url,))
        return (bytes(row[0]), float(row[1])) if row is not None else None

    def put(self, url: str, content: bytes) -> None:
        """Keep ``content`` as the copy of ``url`` (replacing an older one)."""
        now = time.time()
        with self.store.begin() as tx:
            if not isinstance(tx, SqlTransaction):
                with _memory_lock:
                    _memory_copies.setdefault(self.store, {})[url] = (bytes(content), now)
                return
            self._ensure_table(tx)
            if tx.write(f"UPDATE {_TABLE} SET content = ?, fetched_at = ? WHERE url = ?", (content, now, url)) == 0:
                tx.write(f"INSERT INTO {_TABLE} (url, content, fetched_at) VALUES (?, ?, ?)", (url, content, now))

    def _ensure_table(self, tx: SqlTransaction) -> None:
        if self._table_ready:
            return
        d = tx.d
        tx.write(f"CREATE TABLE IF NOT EXISTS {_TABLE} (url TEXT PRIMARY KEY, content {d.blob} NOT NULL, "
                 f"fetched_at {d.double} NOT NULL)")
        self._table_ready = True

    def close(self) -> None:
        """Close the store when this transport opened it."""
        if self._owns_store:
            self.store.close()
