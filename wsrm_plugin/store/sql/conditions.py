"""What engine processes report about what they depend on (``node_condition``): plain rows, no
locks, last report wins (see :class:`~wsrm_plugin.store.api.ConditionManager`)."""

from __future__ import annotations

from typing import Any

from .. import api
from ..api import NodeCondition
from .transaction import SqlTransaction

_COLS = ("kind", "subject", "reporter", "state", "since", "last_error", "detail", "reported_at")


class _Conditions(api.ConditionManager):
    _tx: SqlTransaction

    def put(self, condition: NodeCondition) -> None:
        tx = self._tx
        key = (condition.kind, condition.subject, condition.reporter)
        tx.capture_key("node_condition", *key)
        tx.write(f"INSERT INTO node_condition ({', '.join(_COLS)}) VALUES ({', '.join('?' for _ in _COLS)}) "
                 "ON CONFLICT (kind, subject, reporter) DO UPDATE SET state = excluded.state, "
                 "since = excluded.since, last_error = excluded.last_error, detail = excluded.detail, "
                 "reported_at = excluded.reported_at",
                 (*key, condition.state, condition.since, condition.last_error, condition.detail,
                  condition.reported_at))

    def remove(self, kind: str, *, subject: str | None = None, reporter: str | None = None,
               reported_before: float | None = None) -> int:
        where: list[str] = ["kind = ?"]
        params: list[Any] = [kind]
        for column, op, value in (("subject", "=", subject), ("reporter", "=", reporter),
                                  ("reported_at", "<", reported_before)):
            if value is not None:
                where.append(f"{column} {op} ?")
                params.append(value)
        tx = self._tx
        clause = " AND ".join(where)
        tx.capture("node_condition", clause, params)
        return tx.write(f"DELETE FROM node_condition WHERE {clause}", params)

    def list_all(self, kind: str | None = None) -> list[NodeCondition]:
        sql = f"SELECT {', '.join(_COLS)} FROM node_condition"
        params: list[Any] = []
        if kind is not None:
            sql += " WHERE kind = ?"
            params.append(kind)
        rows = self._tx.all(sql + " ORDER BY since, kind, subject, reporter", params)
        return [NodeCondition(kind=r[0], subject=r[1], reporter=r[2], state=r[3], since=float(r[4]),
                              last_error=r[5], detail=r[6] or "", reported_at=float(r[7])) for r in rows]
