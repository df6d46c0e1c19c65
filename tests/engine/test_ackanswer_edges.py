"""Review of the answer written from pieces (``engine/ackanswer.py``, 20b0258) at its edges: the
characters an identifier may hold that XML writes as they are, and an answer whose last
acknowledgement speaks another WS-RM version than its first (the envelope's head and tail are
then cut from that last version's pieces).  The tree path's bytes, exactly, or the tree path."""

from __future__ import annotations

import itertools

import pytest

from wsrm_plugin.engine.ackanswer import acknowledgement_bytes
from wsrm_plugin.wire import SequenceAcknowledgement
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM10, RM11
from wsrm_plugin.wire.soap import SOAP11, SOAP12

from .test_ackanswer import MESSAGE_ID, _by_tree

#: characters XML 1.0 takes in text as they are, next to those it escapes or refuses: C1
#: controls, NEL, line and paragraph separators, a byte order mark, private use, astral
ODD = ["\x7e", "\x80", "\x85", "\x9f", "\xa0", "\u2028", "\u2029", "\ufeff", "\ufffd", "\ue000",
       "\U0001f600", "]]", "&", ">", "\t", "\x7f"]


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("wsa", ADDRESSING_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("first, last", list(itertools.product([RM10, RM11], repeat=2)),
                         ids=lambda v: v.name)
@pytest.mark.parametrize("odd", ODD, ids=lambda c: f"U+{ord(c[0]):04X}")
def test_odd_identifiers_and_mixed_versions_write_the_tree_paths_bytes(soap, wsa, first, last, odd) -> None:
    acks = [(SequenceAcknowledgement(f"urn:x{odd}y", [(1, 3), (5, 5)]), first),
            (SequenceAcknowledgement("urn:uuid:last", [(2, 2 ** 40)]), last)]
    action = first.sequence_acknowledgement_action
    written = acknowledgement_bytes(soap, wsa, action, MESSAGE_ID, acks)
    if written is None:  # the tree path writes it: only what XML escapes or refuses goes there
        assert odd in ("&", ">", "\t", "\x7f")
        return
    assert written == _by_tree(soap, wsa, action, acks)
