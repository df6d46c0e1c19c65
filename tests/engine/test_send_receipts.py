"""A send's receipt: :class:`ReceiptAtCommit` (numbered by its global transaction's commit) compares
and hashes by its message's identity, before and after the commit."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine import ReceiptAtCommit, ReceiptNotNumbered, SendReceipt


def test_a_receipt_numbered_at_commit_compares_by_its_message_before_and_after_the_commit() -> None:
    first, same, other = ReceiptAtCommit("k", "urn:m1"), ReceiptAtCommit("k", "urn:m1"), ReceiptAtCommit("k", "urn:m2")
    with pytest.raises(ReceiptNotNumbered):
        first.number  # noqa: B018 -- the property raises
    assert first == same and first != other  # unnumbered: no ReceiptNotNumbered
    kept = {first}
    first.at_commit("k2", 7)  # the commit put it on another sequence than guessed
    assert first == same and first in kept and same in kept and other not in kept
    assert (first.sequence_key, first.number) == ("k2", 7)
    # never equal to a SendReceipt of the same place: their hashes read different things
    assert first != SendReceipt("k2", 7, "urn:m1") and SendReceipt("k2", 7, "urn:m1") != first
