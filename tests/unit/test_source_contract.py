"""The source contract runs one way: a source is handed nothing to call back into the runtime.

Every protocol of :mod:`reclock.sources.base` (the contract and its capabilities) is inspected by
its signatures: no parameter of any of its methods may be, or contain, a callable, nor may a
dataclass of the contract a method takes (the probe's :class:`~reclock.sources.base.Answer`) have
a callable field. A source that needs the runtime to act says so in what it returns (a
:class:`~reclock.sources.base.Probe`), and may hand the runtime work to run
(:class:`~reclock.sources.base.RunFirst`): that way round is the contract's.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import typing
from typing import Protocol

import pytest

from reclock.errors import ContractError
from reclock.sources import base
from reclock.sources.base import Probe, SourceContext

PROTOCOLS = sorted(
    (
        value
        for value in vars(base).values()
        if inspect.isclass(value) and getattr(value, "_is_protocol", False) and value is not Protocol
    ),
    key=lambda protocol: protocol.__name__,
)

#: A value the runtime builds once, before a source exists, to construct it from a definition:
#: the reader of the generations file it keeps for a files source is the lake's, given at
#: construction and never during a batch (see docs/source-authors.md, "the context").
CONSTRUCTION = {(SourceContext, "generations_reader")}


def _is_callable(hint: object) -> bool:
    origin = typing.get_origin(hint)
    return hint is collections.abc.Callable or origin is collections.abc.Callable or hint is typing.Callable


def _callables_in(hint: object, seen: set[object]) -> list[str]:
    """Where ``hint`` is or holds a callable: its own type, its type arguments, and the fields
    of a dataclass of the contract it names (recursively)."""
    if hint in seen:
        return []
    seen.add(hint)
    if _is_callable(hint):
        return [repr(hint)]
    found = []
    for arg in typing.get_args(hint):
        found += _callables_in(arg, seen)
    if inspect.isclass(hint) and dataclasses.is_dataclass(hint) and hint.__module__.startswith("reclock.sources"):
        fields = typing.get_type_hints(hint)
        for f in dataclasses.fields(hint):
            if (hint, f.name) not in CONSTRUCTION:
                found += [f"{hint.__name__}.{f.name}: {c}" for c in _callables_in(fields[f.name], seen)]
    return found


def test_the_contract_has_its_protocols():
    names = {p.__name__ for p in PROTOCOLS}
    assert {"Source", "AsksFirst", "GrowsOutputs", "DistinctInserts", "TakesContext"} <= names
    assert not {"RunsTasks", "LandsAhead"} & names  # gone: they handed the runtime's callbacks to sources


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_no_method_of_a_source_protocol_takes_a_callable_from_the_runtime(protocol):
    for name, member in vars(protocol).items():
        function = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if name.startswith("__") or not inspect.isfunction(function):
            continue
        hints = typing.get_type_hints(function, vars(base))
        for parameter in list(inspect.signature(function).parameters)[1:]:
            found = _callables_in(hints.get(parameter), set())
            assert not found, f"{protocol.__name__}.{name}({parameter}) takes a callable: {found}"


def test_the_inspection_finds_a_callable_where_there_is_one():
    """The check above can fail: a protocol whose method takes a callback is caught."""

    class Calls(Protocol):
        def use(self, run: collections.abc.Callable[[int], int]) -> None: ...

    hints = typing.get_type_hints(Calls.use)
    assert _callables_in(hints["run"], set())
    assert _callables_in(SourceContext, set()) == []  # its one callable is the construction-time reader
    assert _callables_in(base.Answer, set()) == []


def test_a_probe_says_exactly_one_thing():
    with pytest.raises(ContractError, match="exactly one"):
        Probe()
    with pytest.raises(ContractError, match="exactly one"):
        Probe(upper=base.Frontier(), run_first=base.RunFirst(len, ()))
