"""The spyne service's own ``serve()`` shortens the interpreter's switch interval on a SQLite store
as the engine's does (``wsrm_plugin.engine.switch_interval``), and its ``stop()`` puts it back."""

from __future__ import annotations

import sys

import pytest
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.service import reliable_service
from wsrm_plugin.engine.switch_interval import AUTOMATIC_SWITCH_INTERVAL, PYTHON_SWITCH_INTERVAL


class _Echo(ServiceBase):
    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, text):  # noqa: N805 -- spyne's signature
        return text


@pytest.fixture(autouse=True)
def python_default():
    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(before)


def test_a_sqlite_service_serves_with_the_shorter_interval_until_it_stops(tmp_path):
    app = Application([_Echo], tns="urn:wsrm-switch-interval", in_protocol=Soap11(), out_protocol=Soap11())
    svc = reliable_service(app, f"sqlite:///{tmp_path}/s.db")
    try:
        svc.serve(threads=1)
        assert sys.getswitchinterval() == pytest.approx(AUTOMATIC_SWITCH_INTERVAL)
    finally:
        svc.stop(timeout=5)
    assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)
