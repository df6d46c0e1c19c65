"""A claimed message is the one after the sequence's delivered prefix as committed, never one that
another transaction delivered while the claim was looking.

PostgreSQL's claim reads a sequence's next message in a ``LATERAL`` subquery
and locks the sequence's row (``FOR UPDATE ... SKIP LOCKED``).  When a delivery
of the sequence commits between the claim's snapshot and its lock, PostgreSQL
locks the row's new version and re-checks the statement's conditions against
it, but not the subquery's: the claim came back with the message just
delivered, whose application then ran a second time (its delivery rolled back
on the missing buffer row, silently).  Under load with delivery on receipt
(a receive delivering the buffer while the invoker thread claims) one run in
about 24 delivered a message twice.  Same suite on all three stores.
"""

from __future__ import annotations

import threading
import time

from wsrm_plugin.store import StorageManager, UnknownMessageError

MESSAGES = 400


def test_a_claim_racing_a_delivery_never_returns_a_delivered_message(store: StorageManager) -> None:
    with store.begin() as tx:
        for n in range(1, MESSAGES + 1):
            assert tx.invoker.put("s", n, b"<m/>", action="urn:a", soap_version="urn:s")
    delivered: list[tuple[str, int]] = []
    stale: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def in_order() -> None:  # as a receive delivering the buffer (Invoker.deliver_through)
        try:
            while not done.is_set():
                with store.begin() as tx:
                    msg = tx.invoker.next_deliverable("s")
                    if msg is None:
                        return
                    tx.invoker.mark_delivered("s", msg.number)
                delivered.append(("through", msg.number))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    def claims() -> None:  # as an invoker thread
        try:
            while not done.is_set():
                try:
                    with store.begin() as tx:
                        msg = tx.invoker.claim_next()
                        if msg is None:
                            time.sleep(0)
                            continue
                        upto = tx.invoker.state("s").delivered.next_expected - 1
                        if msg.number != upto + 1:
                            stale.append((msg.number, upto))
                        tx.invoker.mark_delivered("s", msg.number)
                except UnknownMessageError:
                    continue  # recorded in stale above
                delivered.append(("claim", msg.number))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=in_order), threading.Thread(target=claims)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert stale == [], f"claims returned delivered messages: {stale[:10]}"
    assert sorted(n for _, n in delivered) == list(range(1, MESSAGES + 1))
    assert len({who for who, _ in delivered}) == 2 or len(delivered) == MESSAGES
