"""The ``statemachine`` directive: a machine's picture computed from its code at build time.

::

    ```{statemachine} rms
    ```

draws :func:`wsrm_plugin.statemachine.diagram.to_dot` of the named machine
through ``sphinx.ext.graphviz`` (Debian's ``graphviz`` package provides ``dot``;
the build fails, warnings being errors, without it).  The picture cannot drift
from the rules: it is what the transition function answers for every state
and event when the page is built.
"""

from __future__ import annotations

from typing import Any

from docutils.nodes import Node
from sphinx.application import Sphinx
from sphinx.ext.graphviz import graphviz
from sphinx.util.docutils import SphinxDirective

from wsrm_plugin.statemachine.diagram import machine, to_dot


class StateMachineDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[Node]:
        try:
            m = machine(self.arguments[0])
        except KeyError as exc:
            raise self.error(str(exc.args[0])) from None
        node = graphviz()
        node["code"] = to_dot(m)
        node["options"] = {"docname": self.env.current_document.docname}
        node["alt"] = f"the {m.title} state machine, drawn from {m.transition.__module__}"
        node["align"] = "center"
        return [node]


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.graphviz")
    app.add_directive("statemachine", StateMachineDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
