"""The engine's plain-POST fast path and the proxies the environment names.

Whether a reliable message may skip the zeep session (a plain HTTP POST)
depends on the environment's proxy variables, as requests reads them at each
request.  The answer is kept per address and per value of those variables
(reading them all at every send cost a tenth of the client's CPU), so a
change of the environment must be followed at the very next send.
"""

from __future__ import annotations

import os

import pytest
import requests

from interceptors.zeep_client.session import _nothing_to_honour

ADDRESS = "http://127.0.0.1:9/svc"


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_change_of_the_proxy_variables_is_followed_at_the_next_send(no_proxies) -> None:
    env = no_proxies
    session = requests.Session()
    seen = [_nothing_to_honour(session, ADDRESS)]  # nothing set: a plain POST
    env.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    seen.append(_nothing_to_honour(session, ADDRESS))  # through the session, to its proxy
    env.setenv("no_proxy", "127.0.0.1")
    seen.append(_nothing_to_honour(session, ADDRESS))  # bypassed for this host
    seen.append(_nothing_to_honour(session, "http://192.0.2.1:9/svc"))  # but not for another
    env.delenv("no_proxy")
    seen.append(_nothing_to_honour(session, ADDRESS))
    env.setenv("HTTP_PROXY", "http://127.0.0.1:3129")  # another proxy: still one
    seen.append(_nothing_to_honour(session, ADDRESS))
    env.delenv("HTTP_PROXY")
    seen.append(_nothing_to_honour(session, ADDRESS))
    env.setenv("https_proxy", "http://127.0.0.1:3128")  # any scheme's proxy, as requests decides
    seen.append(_nothing_to_honour(session, ADDRESS))
    assert seen == [True, False, True, False, False, False, True, False]


def test_a_session_that_ignores_the_environment_posts_plainly_whatever_it_says(no_proxies) -> None:
    no_proxies.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    session = requests.Session()
    session.trust_env = False
    assert _nothing_to_honour(session, ADDRESS)
    session.trust_env = True
    assert not _nothing_to_honour(session, ADDRESS)


def test_an_unchanged_environment_is_not_read_again_at_each_send(no_proxies) -> None:
    """requests' reading of the environment runs once per address until the environment changes."""
    asked: list[str] = []
    real = requests.utils.get_environ_proxies

    def counting(url: str, no_proxy: object = None) -> dict[str, str]:
        asked.append(url)
        return real(url, no_proxy=no_proxy)

    no_proxies.setattr(requests.utils, "get_environ_proxies", counting)
    session = requests.Session()
    other = "http://192.0.2.1:9/svc"
    assert all(_nothing_to_honour(session, address) for address in [ADDRESS, other] * 5)
    assert asked == [ADDRESS, other]
    no_proxies.setenv("WSRM_SOMETHING_ELSE", "1")  # any change: read again, then kept
    assert all(_nothing_to_honour(session, ADDRESS) for _ in range(3))
    assert asked == [ADDRESS, other, ADDRESS]
