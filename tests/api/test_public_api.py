"""One public API, importable from ``wsrm_plugin``, without dragging in the other side's framework."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

import wsrm_plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    return set(out.stdout.split())


@pytest.mark.parametrize("name", [n for n in wsrm_plugin.__all__ if n != "__version__"])
def test_every_public_name_resolves_to_its_defining_module(name):
    value = getattr(wsrm_plugin, name)
    module = importlib.import_module(wsrm_plugin._EXPORTS[name])
    assert value is getattr(module, name)


def test_both_sides_and_the_knobs_come_from_one_place():
    from wsrm_plugin import DeliveryAssurance, RMPolicy, reliable_client, reliable_service

    assert reliable_client.__module__ == "interceptors.zeep_client.client"
    assert reliable_service.__module__ == "interceptors.spyne_server.service"
    assert RMPolicy().delivery == DeliveryAssurance.EXACTLY_ONCE | DeliveryAssurance.IN_ORDER


def test_all_names_exactly_the_lazy_exports():
    assert sorted(wsrm_plugin.__all__) == sorted(["__version__", *wsrm_plugin._EXPORTS])


def test_dir_and_all_list_the_public_names():
    for name in ("reliable_service", "reliable_client", "RMPolicy", "DeliveryAssurance", "__version__"):
        assert name in wsrm_plugin.__all__
        assert name in dir(wsrm_plugin)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'reliable_sevrice'"):
        wsrm_plugin.reliable_sevrice  # noqa: B018


def test_importing_the_package_imports_neither_framework():
    loaded = _modules_after("import wsrm_plugin; wsrm_plugin.RMPolicy")
    assert "zeep" not in loaded and "spyne" not in loaded


def test_the_client_side_does_not_import_spyne():
    loaded = _modules_after("from wsrm_plugin import reliable_client, RMPolicy")
    assert "zeep" in loaded and "spyne" not in loaded


def test_the_server_side_does_not_import_zeep():
    loaded = _modules_after("from wsrm_plugin import reliable_service, RMPolicy")
    assert "spyne" in loaded and "zeep" not in loaded
