"""The combiner: concurrent calls of one key run as batches; nobody is left waiting."""

from __future__ import annotations

import threading

import pytest

from wsrm_plugin.engine.combiner import ALONE, Combiner

from .support import wait_for


class _Gate:
    """A batch function that records its batches and holds the first one until opened."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.batches: list[list[str]] = []
        self.open = threading.Event()
        self.fail = fail

    def __call__(self, items: list[str]) -> list[object]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            assert self.open.wait(10)
            if self.fail is not None:
                raise self.fail
        return [ValueError(i) if i.startswith("bad") else i.upper() for i in items]


def _submit(combiner: Combiner, key: str, item: str, out: dict) -> threading.Thread:
    def run() -> None:
        try:
            out[item] = combiner.submit(key, item)
        except BaseException as exc:  # noqa: BLE001 (the test looks at what each caller got)
            out[item] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _queued(combiner: Combiner, key: str) -> int:
    waiting = combiner._waiting.get(key)
    return -1 if waiting is None else len(waiting)


def test_a_lone_call_runs_at_once_as_a_batch_of_one():
    gate = _Gate()
    gate.open.set()
    combiner = Combiner(gate, limit=8)
    assert combiner.submit("k", "a") == "A"
    assert gate.batches == [["a"]] and combiner._waiting == {}


def test_calls_arriving_during_a_batch_form_the_next_one_and_each_gets_its_own_outcome():
    gate = _Gate()
    combiner = Combiner(gate, limit=3)
    out: dict = {}
    threads = [_submit(combiner, "k", "first", out)]
    assert wait_for(lambda: _queued(combiner, "k") == 0)
    for i, item in enumerate(["b", "bad c", "d", "e"], 1):
        threads.append(_submit(combiner, "k", item, out))
        assert wait_for(lambda: _queued(combiner, "k") == i)
    other = _submit(combiner, "other key", "x", out)  # another key does not wait for this one
    other.join(10)
    assert out["x"] == "X"
    gate.open.set()
    for t in threads:
        t.join(10)
    assert gate.batches[0] == ["first"]
    assert gate.batches[2:] == [["b", "bad c", "d"], ["e"]]  # the limit cuts a batch
    assert out["b"] == "B" and out["d"] == "D" and out["e"] == "E"
    assert isinstance(out["bad c"], ValueError)  # raised in its own caller only
    assert combiner._waiting == {}


def test_a_failing_batch_raises_in_its_leader_and_leaves_the_others_to_do_their_item_alone():
    gate = _Gate(fail=RuntimeError("store down"))
    combiner = Combiner(gate, limit=8)
    out: dict = {}
    threads = [_submit(combiner, "k", "first", out)]
    assert wait_for(lambda: _queued(combiner, "k") == 0)
    threads.append(_submit(combiner, "k", "second", out))
    assert wait_for(lambda: _queued(combiner, "k") == 1)
    gate.open.set()
    for t in threads:
        t.join(10)
    assert isinstance(out["first"], RuntimeError)
    assert out["second"] == "SECOND"  # led the next batch: nobody hangs
    assert combiner._waiting == {}


def test_an_item_the_batch_leaves_comes_back_as_alone():
    combiner = Combiner(lambda items: [ALONE for _ in items], limit=4)
    assert combiner.submit("k", "a") is ALONE
    with pytest.raises(ValueError, match="limit"):
        Combiner(lambda items: items, limit=0)


def test_a_batch_that_hands_on_lets_the_next_one_run_before_it_ends():
    """``hand_on`` from inside the batch (its work done, its commit left): the callers waiting
    meanwhile run as the next batch at once, and the first still ends as usual.  Without it the
    next batch waits for the first to return."""
    go, commit, handed = threading.Event(), threading.Event(), []
    batches: list[list[str]] = []

    def batch(items: list[str]) -> list[object]:
        batches.append(list(items))
        if items == ["first"]:
            assert go.wait(10)
            handed.append(combiner.hand_on())
            handed.append(combiner.hand_on())  # once per batch
            assert commit.wait(10)
        return [i.upper() for i in items]

    combiner = Combiner(batch, limit=8)
    assert combiner.hand_on() is False  # not inside a batch
    out: dict = {}
    first = _submit(combiner, "k", "first", out)
    assert wait_for(lambda: _queued(combiner, "k") == 0)
    others = [_submit(combiner, "k", item, out) for item in ("b", "c")]
    assert wait_for(lambda: _queued(combiner, "k") == 2)
    go.set()
    for t in others:
        t.join(10)
    assert (out.get("b"), out.get("c"), "first" in out) == ("B", "C", False)  # while the first commits
    assert handed == [True, False] and batches == [["first"], ["b", "c"]]
    commit.set()
    first.join(10)
    assert out["first"] == "FIRST" and combiner._waiting == {}
    assert (combiner.batches, combiner.items, combiner.handed_on) == (2, 3, 1)


def test_a_batch_takes_late_the_waiting_calls_it_accepts_up_to_its_limit():
    """Callers that came while a batch ran and whose items it accepts (``join_late``) get its
    outcomes and form no batch of their own; the others, and those past the limit, form the next.
    Should the batch fail, the late ones are answered too (ALONE)."""
    for fail in (None, RuntimeError("the commit")):
        release = threading.Event()
        seen: list[list[str]] = []

        def batch(items: list[str], fail: BaseException | None = fail) -> list[object]:
            seen.append(list(items))
            if items == ["first"]:
                assert release.wait(10)
                late = combiner.join_late(lambda item: item.startswith("late"))
                if fail is not None:
                    raise fail
                return [i.upper() for i in items + late]
            return [i.upper() for i in items]

        combiner = Combiner(batch, limit=3)
        out: dict = {}
        threads = [_submit(combiner, "k", "first", out)]
        assert wait_for(lambda: seen == [["first"]])
        for item in ("late1", "other", "late2", "late3"):
            threads.append(_submit(combiner, "k", item, out))
            assert wait_for(lambda: _queued(combiner, "k") == len(threads) - 1)
        release.set()
        for t in threads:
            t.join(10)
        if fail is None:
            assert out == {"first": "FIRST", "late1": "LATE1", "late2": "LATE2",
                           "other": "OTHER", "late3": "LATE3"}
        else:  # the leader's error; the late ones ALONE; the next batch untouched
            assert out["first"] is fail and out["late1"] is ALONE and out["late2"] is ALONE
            assert out["other"] == "OTHER" and out["late3"] == "LATE3"
        assert seen == [["first"], ["other", "late3"]]  # limit 3: late3 stays for the next batch
        assert combiner._waiting == {}
