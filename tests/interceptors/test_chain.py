"""The chain on its own: ordering, stopping, resuming, unwinding, pluggy hooks, entry points."""

from __future__ import annotations

import textwrap

import pluggy
import pytest
from lxml import etree

from interceptors import (
    ChainConfigurationError, ChainError, Direction, Interceptor, InterceptorChain, Message, Phase,
    Response, Role, hookimpl,
)
from wsrm_plugin.wire.namespaces import SOAP11
from wsrm_plugin.wire.soap import build_envelope


def envelope(local: str = "Ping") -> etree._Element:
    return build_envelope(SOAP11, [], etree.Element(f"{{urn:t}}{local}"))


def incoming() -> Message:
    return Message(envelope(), Direction.IN, Role.SERVER)


def outgoing() -> Message:
    return Message(envelope(), Direction.OUT, Role.CLIENT)


class Recorder(Interceptor):
    """Appends (name, what) to a shared log; optional action per direction."""

    def __init__(self, name: str, phase: Phase, log: list, *, before=None, after=None,
                 on_in=None, on_out=None) -> None:
        super().__init__(name=name, phase=phase, before=before, after=after)
        self.log, self.on_in, self.on_out = log, on_in, on_out

    def handle_in(self, message: Message) -> None:
        self.log.append((self.name, "in"))
        if self.on_in:
            self.on_in(message)

    def handle_out(self, message: Message) -> None:
        self.log.append((self.name, "out"))
        if self.on_out:
            self.on_out(message)

    def handle_fault(self, message: Message, error: BaseException) -> None:
        self.log.append((self.name, "fault"))


# -- ordering -------------------------------------------------------------------------

def test_phases_order_the_in_chain_and_the_out_chain_is_its_mirror():
    log: list = []
    chain = InterceptorChain([
        Recorder("dispatch", Phase.DISPATCH, log),
        Recorder("rm", Phase.RELIABLE_MESSAGING, log),
        Recorder("transport", Phase.TRANSPORT, log),
        Recorder("wsa", Phase.ADDRESSING, log),
        Recorder("transport2", Phase.TRANSPORT, log),
    ])
    assert chain.names() == ["transport", "transport2", "wsa", "rm", "dispatch"]
    assert chain.names(Direction.OUT) == ["dispatch", "rm", "wsa", "transport2", "transport"]
    chain.handle_in(incoming())
    chain.handle_out(outgoing())
    assert [n for n, _ in log] == ["transport", "transport2", "wsa", "rm", "dispatch",
                                   "dispatch", "rm", "wsa", "transport2", "transport"]
    assert [d for _, d in log] == ["in"] * 5 + ["out"] * 5


def test_before_and_after_order_a_phase_and_ties_keep_registration_order():
    log: list = []
    phase = Phase.RELIABLE_MESSAGING
    chain = InterceptorChain([
        Recorder("c", phase, log, after=["a"]),
        Recorder("a", phase, log),
        Recorder("b", phase, log, before="a"),      # a lone string is one name, not letters
        Recorder("d", phase, log),
        Recorder("e", phase, log, before=["c"], after=["absent-peer"]),
    ])
    assert chain.names() == ["b", "a", "d", "e", "c"]
    assert chain.names(Direction.OUT) == ["c", "e", "d", "a", "b"]


def test_constraints_across_phases_must_agree_with_the_phase_order():
    log: list = []
    ok = InterceptorChain([Recorder("wsa", Phase.ADDRESSING, log),
                           Recorder("rm", Phase.RELIABLE_MESSAGING, log, after=["wsa"])])
    assert ok.names() == ["wsa", "rm"]
    with pytest.raises(ChainConfigurationError, match="phase ADDRESSING comes first"):
        InterceptorChain([Recorder("wsa", Phase.ADDRESSING, log),
                          Recorder("rm", Phase.RELIABLE_MESSAGING, log, before=["wsa"])])


def test_a_cycle_is_refused_and_leaves_the_chain_as_it_was():
    log: list = []
    chain = InterceptorChain([Recorder("a", Phase.DISPATCH, log, before=["b"])])
    with pytest.raises(ChainConfigurationError, match=r"cycle among \['a', 'b'\]"):
        chain.add(Recorder("b", Phase.DISPATCH, log, before=["a"]))
    assert chain.names() == ["a"]
    with pytest.raises(ChainConfigurationError, match="itself"):
        chain.add(Recorder("s", Phase.DISPATCH, log, after=["s"]))


def test_bad_interceptors_are_refused_with_the_reason():
    log: list = []
    chain = InterceptorChain([Recorder("a", Phase.DISPATCH, log)])
    with pytest.raises(ChainConfigurationError, match="already in the chain"):
        chain.add(Recorder("a", Phase.TRANSPORT, log))

    class NoPhase:
        name, phase = "x", 3

        def handle_in(self, message):
            pass

    with pytest.raises(ChainConfigurationError, match="phase must be an interceptors.Phase"):
        chain.add(NoPhase())

    class NoHandlers:
        name, phase = "y", Phase.DISPATCH

    with pytest.raises(ChainConfigurationError, match="neither handle_in nor handle_out"):
        chain.add(NoHandlers())
    assert chain.names() == ["a"]


def test_remove_and_lookup():
    log: list = []
    a, b = Recorder("a", Phase.DISPATCH, log), Recorder("b", Phase.TRANSPORT, log)
    chain = InterceptorChain([a, b])
    assert chain.get("a") is a and "b" in chain and len(chain) == 2
    assert chain.remove("b") is b
    assert list(chain) == [a] and chain.get("b") is None and not chain.has_phase(Phase.TRANSPORT)
    with pytest.raises(KeyError):
        chain.remove("b")


# -- stopping, resuming, unwinding ---------------------------------------------------------

def test_abort_stops_the_chain_and_keeps_the_response():
    log: list = []
    answer = Response(envelope=envelope("Pong"))
    chain = InterceptorChain([
        Recorder("wsa", Phase.ADDRESSING, log),
        Recorder("rm", Phase.RELIABLE_MESSAGING, log, on_in=lambda m: m.abort(answer)),
        Recorder("dispatch", Phase.DISPATCH, log),
    ])
    message = chain.handle_in(incoming())
    assert log == [("wsa", "in"), ("rm", "in")]
    assert message.aborted and message.stopped and not message.suspended
    assert message.stopped_by == "rm" and message.response is answer
    assert answer.status_code == 200 and Response().status_code == 202


def test_suspend_then_resume_runs_each_remaining_interceptor_once():
    log: list = []
    chain = InterceptorChain([
        Recorder("wsa", Phase.ADDRESSING, log),
        Recorder("store", Phase.RELIABLE_MESSAGING, log,
                 on_in=lambda m: None if m.context.get("resumed") else m.suspend()),
        Recorder("later", Phase.RELIABLE_MESSAGING, log, after=["store"]),
        Recorder("dispatch", Phase.DISPATCH, log),
    ])
    message = chain.handle_in(incoming())
    assert message.suspended and message.resume_point == "store"
    assert log == [("wsa", "in"), ("store", "in")]
    # A worker rebuilds the message from the stored bytes, as after a restart.
    stored = Message.from_bytes(message.to_bytes(), Direction.IN, Role.SERVER,
                                resume_point=message.resume_point)
    chain.resume(stored)
    assert not stored.stopped
    assert log[2:] == [("later", "in"), ("dispatch", "in")]
    with pytest.raises(ChainError, match="was not suspended"):
        chain.resume(incoming())
    with pytest.raises(ChainError, match="no interceptor of that name"):
        chain.resume(incoming(), after="nope")


def test_resuming_runs_the_hooks_from_the_resume_points_phase_and_follows_a_changed_chain():
    """A resumed message skips the phases before its interceptor's, hooks included, but its
    phase's hook runs; a chain changed after a resume resumes by its new order (the rest of a
    plan is worked out once: a stale one would skip ``added`` or run ``removed``)."""
    calls: list = []

    class Watcher:
        @hookimpl
        def wsrm_in_message(self, phase):
            calls.append(phase)

    log: list = []
    chain = InterceptorChain([
        Recorder("wsa", Phase.ADDRESSING, log),
        Recorder("store", Phase.RELIABLE_MESSAGING, log),
        Recorder("removed", Phase.RELIABLE_MESSAGING, log, after=["store"]),
        Recorder("dispatch", Phase.DISPATCH, log),
    ], plugins=[Watcher()])
    for _ in range(2):  # (the second from what was worked out the first time)
        log.clear(), calls.clear()
        chain.resume(incoming(), after="store")
        assert log == [("removed", "in"), ("dispatch", "in")]
        assert calls == [p for p in Phase if p >= Phase.RELIABLE_MESSAGING]
    chain.remove("removed")
    chain.add(Recorder("added", Phase.RELIABLE_MESSAGING, log, after=["store"]))
    log.clear()
    chain.resume(incoming(), after="store")
    assert log == [("added", "in"), ("dispatch", "in")]
    log.clear()
    chain.resume(outgoing(), after="dispatch")  # the out order: the mirror of the in order
    assert log == [("added", "out"), ("store", "out"), ("wsa", "out")]


def test_a_failure_unwinds_the_interceptors_that_ran_most_recent_first():
    log: list = []
    seen: list = []

    class FaultWatcher:
        @hookimpl
        def wsrm_fault(self, message, error):
            seen.append((message.stopped_by, str(error)))

    def fail(message):
        raise ValueError("boom")

    def broken_fault_handler(message, error):
        raise RuntimeError("handler bug")

    first = Recorder("first", Phase.TRANSPORT, log)
    first.handle_fault = lambda m, e: (log.append(("first", "fault")), broken_fault_handler(m, e))
    chain = InterceptorChain([
        first,
        Recorder("second", Phase.ADDRESSING, log),
        Recorder("raiser", Phase.RELIABLE_MESSAGING, log, on_in=fail),
        Recorder("never", Phase.DISPATCH, log),
    ], plugins=[FaultWatcher()])
    message = incoming()
    with pytest.raises(ValueError, match="boom"):   # the original error, not the handler's
        chain.handle_in(message)
    assert log == [("first", "in"), ("second", "in"), ("raiser", "in"),
                   ("raiser", "fault"), ("second", "fault"), ("first", "fault")]
    assert seen == [(None, "boom")]
    assert isinstance(message.error, ValueError)


def test_the_chain_refuses_a_message_going_the_other_way():
    chain = InterceptorChain()
    with pytest.raises(ChainError):
        chain.handle_in(outgoing())
    with pytest.raises(ChainError):
        chain.handle_out(incoming())


def test_message_knows_its_exchange_and_headers():
    request = incoming()
    reply = Message(envelope("Pong"), Direction.OUT, Role.SERVER, exchange=request.exchange)
    assert request.is_request and not reply.is_request
    assert reply.request is request and request.exchange.response is reply
    header = etree.Element("{urn:t}H")
    reply.add_header(header)
    reply.add_header(etree.Element("{urn:t}First"), first=True)
    assert [h.tag for h in reply.header_elements()] == ["{urn:t}First", "{urn:t}H"]
    reply.remove_header(header)
    assert [h.tag for h in reply.header_elements()] == ["{urn:t}First"]
    assert reply.body_element.tag == "{urn:t}Pong" and not reply.is_fault
    with pytest.raises(ValueError, match="SOAP 1.1 or 1.2 Envelope"):
        Message(etree.Element("notsoap"), Direction.IN, Role.SERVER)
    message = incoming()
    message.http_headers["SOAPAction"] = '"x"'
    assert message.http_headers["soapaction"] == '"x"' and list(message.http_headers) == ["SOAPAction"]


# -- pluggy ----------------------------------------------------------------------------

def test_hooks_are_called_once_per_phase_in_each_direction():
    calls: list = []

    class Watcher:
        @hookimpl
        def wsrm_in_message(self, message, phase):
            calls.append(("in", phase))

        @hookimpl
        def wsrm_out_message(self, phase):      # pluggy passes only what is asked for
            calls.append(("out", phase))

    log: list = []
    chain = InterceptorChain([Recorder("wsa", Phase.ADDRESSING, log)], plugins=[Watcher()])
    chain.handle_in(incoming())
    chain.handle_out(outgoing())
    assert calls == [("in", p) for p in Phase] + [("out", p) for p in reversed(Phase)]


def test_a_message_and_its_exchange_are_freed_without_the_garbage_collector():
    """The exchange refers to its messages weakly: a request and its reply, let go of, are freed by
    reference counting (each made a cycle with its exchange: fails without)."""
    import gc
    import weakref

    was = gc.isenabled()
    gc.disable()
    try:
        request = incoming()
        reply = Message(envelope("Pong"), Direction.OUT, Role.SERVER, exchange=request.exchange)
        exchange = request.exchange
        exchange.properties["kept"] = object()
        gone = [weakref.ref(request), weakref.ref(reply)]
        linked = exchange.request is request and exchange.response is reply and reply.request is request
        del request, reply
        assert linked
        assert [ref() for ref in gone] == [None, None]
        assert exchange.request is None and exchange.response is None  # nobody held them
    finally:
        if was:
            gc.enable()


def test_a_hook_can_abort_but_not_suspend():
    class Gate:
        @hookimpl
        def wsrm_in_message(self, message, phase):
            if phase is Phase.ADDRESSING:
                if message.context.get("try_suspend"):
                    message.suspend()
                message.abort(Response(status=403))

    log: list = []
    chain = InterceptorChain([Recorder("rm", Phase.RELIABLE_MESSAGING, log)], plugins=[Gate()])
    message = chain.handle_in(incoming())
    assert message.aborted and message.response.status_code == 403 and log == []
    assert message.stopped_by == "wsrm_in_message hook"
    attempt = incoming()
    attempt.context["try_suspend"] = True
    with pytest.raises(ChainError, match="hooks can abort, not suspend"):
        chain.handle_in(attempt)


def test_a_plugin_registered_later_still_adds_its_interceptors():
    log: list = []

    class Module:
        @hookimpl
        def wsrm_register_interceptors(self, chain):
            chain.add(Recorder("from-plugin", Phase.DISPATCH, log))

    chain = InterceptorChain([Recorder("wsa", Phase.ADDRESSING, log)])
    chain.register_plugin(Module())
    chain.handle_in(incoming())
    assert log == [("wsa", "in"), ("from-plugin", "in")]


def test_a_plugin_with_a_hook_the_specs_do_not_have_is_refused():
    class Typo:
        @hookimpl
        def wsrm_in_mesage(self, message):
            pass

    chain = InterceptorChain()
    chain.register_plugin(Typo())   # unknown hooks are only an error once checked
    with pytest.raises(pluggy.PluginValidationError, match="wsrm_in_mesage"):
        chain.plugins.check_pending()


# -- entry points ------------------------------------------------------------------------

def install_distribution(root, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """A real installed distribution: a *.dist-info with METADATA and entry_points.txt."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


def test_interceptors_and_plugins_are_loaded_from_the_entry_point_group(tmp_path, monkeypatch):
    install_distribution(tmp_path, "wsrm_ext_demo", """
        [wsrm_interceptors]
        tagger = wsrm_ext_demo_mod:Tagger
        watcher = wsrm_ext_demo_mod:watcher_plugin
    """, {"wsrm_ext_demo_mod": """
        from interceptors import Interceptor, Phase, hookimpl

        class Tagger(Interceptor):
            name = "tagger"
            phase = Phase.TRANSPORT

            def handle_in(self, message):
                message.context.setdefault("seen", []).append("tagger")

        class _Watcher:
            @hookimpl
            def wsrm_in_message(self, message, phase):
                if phase is Phase.DISPATCH:
                    message.context.setdefault("seen", []).append("watcher")

        watcher_plugin = _Watcher()
    """})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))   # seen twice on sys.path: loaded once
    chain = InterceptorChain(load_entry_points=True)
    assert "tagger" in chain and chain.get("tagger").phase is Phase.TRANSPORT
    message = chain.handle_in(incoming())
    assert message.context["seen"] == ["tagger", "watcher"]
    assert chain.load_entry_points() == []     # loading again adds nothing


@pytest.mark.parametrize("entry, reason", [
    ("junk = wsrm_ext_bad_mod:NOT_A_PLUGIN", "neither an interceptor"),
    ("broken = wsrm_ext_bad_missing:Thing", "failed to load"),
    ("needy = wsrm_ext_bad_mod:Needy", "constructible without arguments"),
])
def test_a_bad_entry_point_is_refused_with_the_reason(tmp_path, monkeypatch, entry, reason):
    group = f"wsrm_test_bad_{entry.split()[0]}"
    install_distribution(tmp_path, "wsrm_ext_bad", f"[{group}]\n{entry}\n", {"wsrm_ext_bad_mod": """
        from interceptors import Interceptor, Phase
        NOT_A_PLUGIN = 42

        class Needy(Interceptor):
            phase = Phase.DISPATCH

            def __init__(self, setting):
                super().__init__()
    """})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ChainConfigurationError, match=reason):
        InterceptorChain(load_entry_points=True, entry_point_group=group)


@pytest.mark.parametrize("kind", [dict, list, lambda pairs: tuple(pairs), lambda pairs: (p for p in pairs)],
                         ids=["dict", "list", "tuple", "generator"])
def test_http_headers_take_names_in_any_case_a_later_one_winning_and_refuse_a_value_not_text(kind):
    # a dict and a list are read in one loop (every message received makes two such tables):
    # what the table holds and what it refuses stay those of setting each header in turn
    from interceptors.message import HttpHeaders

    pairs = [("Content-Type", "text/xml"), ("SOAPAction", '"a"'), ("content-type", "application/soap+xml")]
    source = dict(pairs) if kind is dict else kind(pairs)
    headers = HttpHeaders(source)
    # the later spelling wins the name and the value, in the first one's place
    assert list(headers.items()) == [("content-type", "application/soap+xml"), ("SOAPAction", '"a"')]
    assert headers["CONTENT-TYPE"] == "application/soap+xml" and len(headers) == 2
    bad = [("Content-Type", "text/xml"), ("Content-Length", 12)]
    with pytest.raises(TypeError, match="'Content-Length' needs a str value, not int"):
        HttpHeaders(dict(bad) if kind is dict else kind(bad))


def test_a_response_says_its_status_line_and_headers_for_the_envelope_it_holds_when_asked():
    # the status line is looked up once a code and the envelope's version read once: a line or a
    # Content-Type stays that of the status and the envelope the response holds when asked
    from wsrm_plugin.wire.namespaces import SOAP12

    assert Response(202).status_line == "202 Accepted"
    assert Response(299).status_line == Response(299).status_line == "299 Unknown"
    answer = Response(envelope=build_envelope(SOAP11, body=[etree.Element("{urn:x}a")]))
    assert answer.status_line == "200 OK"
    assert answer.headers(b"12345").pairs() == [("Content-Type", "text/xml; charset=utf-8"), ("Content-Length", "5")]
    answer.envelope = build_envelope(SOAP12, body=[etree.Element("{urn:x}a")])
    assert answer.headers(b"123")["content-type"].startswith("application/soap+xml")
    answer.status = 500
    assert answer.status_line == "500 Internal Server Error"
    answer.envelope = None
    assert answer.headers(b"").pairs() == [("Content-Length", "0")] and answer.status_line == "500 Internal Server Error"
    kept = Response(envelope=build_envelope(SOAP11, body=[]),
                    http_headers={"content-type": "text/xml", "Content-Length": "1", "X-A": "b"})
    assert kept.headers(b"ab").pairs() == [("content-type", "text/xml"), ("Content-Length", "2"), ("X-A", "b")]


def test_a_message_carries_ws_rm_when_a_header_block_or_its_body_is_in_either_version():
    # read from the tags' text: a namespace that merely begins like WS-RM's, a comment, an element
    # in no namespace or a WS-A header do not count
    from interceptors.spyne_server.reliable import carries_rm
    from wsrm_plugin.wire.namespaces import RM10, RM11, SOAP12, WSA_2005_08

    def carries(headers=(), body=()):
        return carries_rm(Message(build_envelope(SOAP12, headers, body), Direction.IN, Role.SERVER))

    for rm in (RM10, RM11):
        assert carries([etree.Element(WSA_2005_08.qname("To")), etree.Comment("x"),
                        etree.Element(rm.qname("AckRequested"))])
        assert carries(body=[etree.Element(rm.qname("CreateSequence"))])
        assert not carries([etree.Element(f"{{{rm.ns}x}}Sequence"), etree.Element("Sequence")],
                           [etree.Element(f"{{{rm.ns}/}}CreateSequence")])
    assert not carries([etree.Comment("x")], [etree.Comment("y")])
    assert not carries([etree.Element(WSA_2005_08.qname("Action"))], [etree.Element("{urn:app}record")])


def test_a_messages_soap_version_is_its_envelopes_namespace_and_nothing_else_has_one():
    # an Envelope's tag is looked up whole first; any other element is read as before
    from interceptors.message import _soap_version_of
    from wsrm_plugin.wire.namespaces import SOAP12

    assert _soap_version_of(build_envelope(SOAP11)) is SOAP11
    assert _soap_version_of(build_envelope(SOAP12)) is SOAP12
    assert _soap_version_of(etree.Element(SOAP12.qname("Body"))) is SOAP12
    for other in (etree.Element("Envelope"), etree.Element("{urn:x}Envelope"), etree.Comment("x"), None):
        assert _soap_version_of(other) is None
    assert Message(build_envelope(SOAP12), Direction.IN, Role.SERVER).soap_version is SOAP12
    with pytest.raises(ValueError, match="must be a SOAP 1.1 or 1.2 Envelope"):
        Message(etree.Element("{urn:x}Envelope"), Direction.IN, Role.SERVER)
