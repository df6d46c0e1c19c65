"""RMPolicy's fields are declared (wsrm_plugin.engine.knobs): each check refuses what it should, with
a message naming the field and what it accepts, and no field escapes a declaration."""

from __future__ import annotations

import dataclasses

import pytest

from wsrm_plugin import RMPolicy
from wsrm_plugin.engine.knobs import Choice, Count, Flag, Named, Number, Seconds, check_fields, knob, knobs


def test_every_field_of_the_policy_is_declared_and_its_default_passes_its_own_check():
    declared = knobs(RMPolicy)
    assert list(declared) == [f.name for f in dataclasses.fields(RMPolicy)]
    for name, (field, declaration) in declared.items():
        assert declaration.what, name
        declaration.check(name, field.default)


@pytest.mark.parametrize("check,good,bad,says", [
    (Seconds(), [0.1, 3, 1e9], [0, -1, True, "3", None], "x must be > 0 seconds, not"),
    (Seconds(inclusive=True, at_minimum="at once"), [0, 0.0, 2.5], [-0.1, False],
     "x must be >= 0 (0: at once) seconds"),
    (Seconds(none="never"), [None, 1.0], [0, -5], "or None (never)"),
    (Count(), [1, 10_000], [0, 1.5, True, None, "2"], "x must be an int >= 1, not"),
    (Count(0, none="for ever"), [0, 7, None], [-1, 2.0], "x must be an int >= 0 or None (for ever)"),
    (Number(1), [1, 1.5, 2], [0.99, True, None], "x must be a number >= 1"),
    (Choice(("hold", "continue")), ["hold", "continue"], ["drop", None, 1], "x must be one of ['hold', 'continue']"),
    (Flag(), [True, False], [1, 0, None, "yes"], "x must be True or False"),
    (Flag(none="automatic"), [None, True], ["yes"], "or None (automatic)"),
])
def test_each_kind_of_check_takes_its_range_and_says_what_it_wants(check, good, bad, says):
    for value in good:
        assert check("x", value) is value
    for value in bad:
        with pytest.raises(ValueError, match=r"^x ") as refused:
            check("x", value)
        assert says in str(refused.value)


def test_a_name_becomes_its_object():
    a, b = object(), object()
    check = Named({"one": a, "two": b}, none="the usual")
    assert check("v", "one") is a and check("v", b) is b and check("v", None) is None
    with pytest.raises(ValueError, match=r"v 'three' is not one of \['one', 'two'\]"):
        check("v", "three")
    with pytest.raises(ValueError, match="v must be one of"):
        check("v", object())
    with pytest.raises(ValueError, match="v must be one of"):
        Named({"one": a})("v", None)


def test_the_policy_normalizes_names_and_keeps_every_rule_between_fields():
    assert RMPolicy(ack_request="never").ack_request.value == "never"
    with pytest.raises(ValueError, match="ack_request 'sometimes'"):
        RMPolicy(ack_request="sometimes")
    with pytest.raises(ValueError, match="max_retransmission_interval must be >= base_retransmission_interval"):
        RMPolicy(base_retransmission_interval=10, max_retransmission_interval=5)
    with pytest.raises(ValueError, match="max_delivery_retry_delay must be >= delivery_retry_delay"):
        RMPolicy(delivery_retry_delay=20.0)
    with pytest.raises(ValueError, match="a message alone must fit"):
        RMPolicy(max_held_bytes=1024, max_message_size=2048)
    with pytest.raises(ValueError, match="decoupled_acks must be True or False"):
        RMPolicy(decoupled_acks="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delivery must be a DeliveryAssurance"):
        RMPolicy(delivery="ExactlyOnce")  # type: ignore[arg-type]


def test_replace_checks_again_and_remembers_only_what_changed():
    policy = RMPolicy(max_retries=3).replace(rm_version="1.0")
    assert policy.explicit_fields == {"max_retries", "rm_version"}
    with pytest.raises(ValueError, match="invoker_threads"):
        policy.replace(invoker_threads=0)


def test_a_field_without_a_declaration_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Half:
        declared: int = knob(1, Count(), "a declared knob")
        forgotten: int = 2

        def __post_init__(self) -> None:
            check_fields(self)

    with pytest.raises(TypeError, match="Half.forgotten has no knob"):
        Half()
