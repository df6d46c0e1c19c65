"""Replies recorded after their call was answered: one thread, in the order they came.

A sequential request-reply caller that reads its reply from the HTTP response waited for the
reply's record (a store transaction) before it had its answer.  On a store whose record costs
a network round trip (PostgreSQL) the call is answered first, and the record is made by this
thread while the caller goes on (``Destination.answer_before_record``): its round trip runs
beside the caller's next transaction instead of before its answer.

One thread, first in first out: the records of one sequence keep their order.  What needs a
reply recorded waits for the records handed over before it, and only those
(:meth:`LaterRecords.wait`): the caller's next claim on the sequence, which finds the request
before it acknowledged only once that request's reply is recorded.
"""

from __future__ import annotations

import logging

from txmanager.job_threads import JobThreads

__all__ = ["LaterRecords"]

log = logging.getLogger(__name__)


class LaterRecords(JobThreads):
    """One thread (started when first needed) that runs the records handed to it in the order
    they came; :meth:`wait` waits for those handed over so far.  Each record catches its own
    errors: one that raises is logged."""

    logger = log
    failure = "a reply's record after its call was answered failed"

    def __init__(self, name: str = "wsrm") -> None:
        super().__init__(1, f"{name}-reply-records")
