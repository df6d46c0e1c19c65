"""Check a request's values against the WSDL's schema before it is enqueued.

Plain zeep learns of a wrong argument (``reserve(1, 2, "notint")`` for an
``xs:int``) at the call site: the server's schema validation answers with a
fault.  A reliable call is only enqueued there; the server sees it later,
when nobody is waiting for the answer.  So the reliable client checks the
envelope zeep built, before it is stored, and raises zeep's own
:class:`zeep.exceptions.ValidationError` (with the element path) at the call.

The check reads every simple value back with the type zeep resolved from
the WSDL (what zeep itself does to a reply): a value that does not read back
(``int("notint")``, a malformed date...) is refused.  It covers
document/literal bodies (each body child a global schema element), the
style WS-I and spyne use; facets zeep does not model (patterns, lengths) are
left to the server.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from lxml import etree
from zeep.exceptions import ValidationError
from zeep.xsd.types.simple import AnySimpleType

__all__ = ["validate_request"]

log = logging.getLogger(__name__)

_XSI_NIL = "{http://www.w3.org/2001/XMLSchema-instance}nil"
_SOAP_ENVS = ("http://schemas.xmlsoap.org/soap/envelope/", "http://www.w3.org/2003/05/soap-envelope")


def validate_request(schema: Any, envelope: etree._Element) -> None:
    """Raise ValidationError when a value in ``envelope``'s body does not fit ``schema`` (zeep's types)."""
    body = next((envelope.find(f"{{{ns}}}Body") for ns in _SOAP_ENVS
                 if envelope.find(f"{{{ns}}}Body") is not None), None)
    if body is None:
        return
    for node in body:
        if not isinstance(node.tag, str):
            continue
        try:
            element = _global_element(schema, node.tag)
        except Exception as exc:  # noqa: BLE001 -- not a global element (rpc style): nothing to check against
            log.debug("request body element %s is no global schema element (%s): not checked", node.tag, exc)
            continue
        _check(element, node, [etree.QName(node).localname])


#: Each schema's global elements by tag, as found: zeep's ``get_element`` parses the tag into a
#: QName and walks the schema's documents at every call, for the one or two operations a client
#: calls again and again.  Weak keys: a dropped WSDL's schema goes with it.  An element not found
#: is looked up again next time (a schema may gain documents).
_ELEMENTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _global_element(schema: Any, tag: str) -> Any:
    try:
        found = _ELEMENTS[schema]
    except KeyError:
        found = {}
        try:
            _ELEMENTS[schema] = found
        except TypeError:  # a schema that cannot be weakly referenced: looked up each time
            pass
    except TypeError:
        found = {}
    element = found.get(tag)
    if element is None:
        element = found[tag] = schema.get_element(tag)
    return element


def _check(element: Any, node: etree._Element, path: list[str]) -> None:
    if node.get(_XSI_NIL) in ("true", "1"):
        return
    type_ = getattr(element, "type", None)
    if isinstance(type_, AnySimpleType):
        text = node.text or ""
        try:
            type_.pythonvalue(text)
        except Exception as exc:  # noqa: BLE001 -- whatever the type's reader raises: not a valid value
            name = type_.qname.localname if getattr(type_, "qname", None) is not None else type(type_).__name__
            raise ValidationError(f"{text!r} is not a valid value of type {name} ({exc})", path=path) from None
        return
    children = _children(type_)
    if children is None:
        return
    for child_node in node:
        if not isinstance(child_node.tag, str):
            continue
        child = children.get(child_node.tag)
        if child is not None:  # xs:any and unknown elements are the server's to judge
            _check(child, child_node, [*path, etree.QName(child_node).localname])


#: Each complex type's child elements by tag, built once: zeep's ``elements`` walks the type's
#: whole content model at every read, and the same few types are checked at every call.  Weak
#: keys: a dropped WSDL's types go with it.
_CHILDREN: weakref.WeakKeyDictionary[Any, dict[str, Any] | None] = weakref.WeakKeyDictionary()


def _children(type_: Any) -> dict[str, Any] | None:
    """``type_``'s child elements by tag, or None for a type without element content."""
    if type_ is None:
        return {}
    try:
        return _CHILDREN[type_]
    except (KeyError, TypeError):  # TypeError: a type that cannot be weakly referenced, read each time
        pass
    try:
        children: dict[str, Any] | None = {
            child.qname.text if hasattr(child.qname, "text") else str(child.qname): child
            for _, child in type_.elements}
    except AttributeError:  # a type without element content
        children = None
    try:
        _CHILDREN[type_] = children
    except TypeError:
        pass
    return children
