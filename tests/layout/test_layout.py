"""The folder layout is the architecture: library code never leans on the tools, and each side
imports only its own framework."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ["txmanager", "wsrm_plugin", "interceptors"]


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _library_modules():
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("wsrm_plugin", "tools"):
                continue
            yield rel, path


def test_no_library_module_imports_the_tools():
    # The CLI assembles subcommands, some of which are tools: it is the one allowed door.
    offenders = [str(rel) for rel, path in _library_modules()
                 if rel != pathlib.Path("wsrm_plugin/cli.py")
                 and any(name == "wsrm_plugin.tools" or name.startswith("wsrm_plugin.tools.")
                         for name in _imports(path))]
    assert offenders == []


def test_the_tools_are_not_left_at_their_old_places():
    old = ["wsrm_plugin/demo.py", "wsrm_plugin/demo_peer.py", "wsrm_plugin/proxy.py",
           "txmanager/bank.py", "txmanager/crashworker.py", "txmanager/demo.py", "txmanager/pgserver.py",
           "interceptors/spyne_rm.py", "interceptors/zeep_adapter.py", "wsrm_plugin/zeep_client.py"]
    assert [p for p in old if (ROOT / p).exists()] == []


def _imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_the_server_side_does_not_import_zeep():
    assert "zeep" not in _imported_after("interceptors.spyne_server.service")


def test_the_client_side_does_not_import_spyne():
    assert "spyne" not in _imported_after("interceptors.zeep_client.client")
