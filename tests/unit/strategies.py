"""Hypothesis strategies for the time model, shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from reclock import Bindings, Frontier

partitions = st.sampled_from([0, 1, 2, "gen-0", ("orders", 3)])

finite_frontiers = st.dictionaries(partitions, st.integers(0, 30), max_size=5).map(Frontier)

frontiers = st.one_of(finite_frontiers, finite_frontiers, finite_frontiers, st.just(Frontier.closed()))


@st.composite
def binding_lists(draw: st.DrawFn, max_size: int = 8) -> list[tuple[int, Frontier]]:
    """Valid mint sequences: times strictly increase, frontiers never regress (may stay, may close)."""
    out = []
    t = draw(st.integers(0, 50))
    frontier = Frontier()
    for _ in range(draw(st.integers(0, max_size))):
        step = draw(st.dictionaries(partitions, st.integers(0, 10), max_size=3))
        frontier = frontier.join(Frontier({p: frontier.offset(p) + d for p, d in step.items()}))
        if draw(st.integers(0, 20)) == 0:
            frontier = Frontier.closed()
        out.append((t, frontier))
        if frontier.is_closed:
            break
        t += draw(st.integers(1, 100))
    return out


def build(bindings: list[tuple[int, Frontier]]) -> Bindings:
    b = Bindings()
    for t, f in bindings:
        b.mint(t, f)
    return b
