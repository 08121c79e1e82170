"""The supervisor's transition table: the code moves only along it, and its docstring shows it."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from daemon.node_state.states import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    State,
    allowed,
    diagram,
)
from daemon.node_state.view import NodeView
from daemon.supervision import after_stop, supervisor

# Helpers a handler may return through, and the state each one returns.
HELPERS = {
    "_done": State.DONE,
    "_fail": State.FAILED,
    "_stop": State.STOPPING,
    "_drain": State.DRAINING,
}


def _function(module: object, name: str) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(module)))  # type: ignore[arg-type]
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _returned_states(fn: ast.FunctionDef) -> set[State]:
    """Every state a handler can return: `State.X` literals, the helpers above, and, for
    `return v.state` after `v = after_stop(...)`, every state after_stop's verdicts name.
    A return the test cannot read fails it, so a new kind of return cannot hide a move."""
    out: set[State] = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        found: set[State] = set()
        for sub in ast.walk(node.value):
            named = isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
            if named and sub.value.id == "State":  # type: ignore[attr-defined]
                found.add(State[sub.attr])  # type: ignore[attr-defined]
            helper = isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
            if helper and sub.func.attr in HELPERS:  # type: ignore[attr-defined]
                found.add(HELPERS[sub.func.attr])  # type: ignore[attr-defined]
        value = node.value  # `v.state`, or `to(v.state, commands...)` (commands.py)
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "to" and value.args:
            value = value.args[0]
        if not found and ast.unparse(value) == "v.state":
            assert "after_stop(" in ast.unparse(fn), f"{fn.name}: v is not after_stop's verdict"
            found = _returned_states(_function(after_stop, "after_stop"))
        assert found, f"{fn.name}: cannot tell which state `return {ast.unparse(node.value)}` is"
        out |= found
    return out


def _moves_in_code() -> set[tuple[State, State]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(supervisor.Supervisor)))
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    moves = set()
    for state in State:
        handler = methods.get(f"_{state.value}")
        if handler is None:
            assert state in TERMINAL, f"no handler _{state.value} for {state.name}"
            continue
        moves |= {(state, to) for to in _returned_states(handler) if to != state}
        if state not in TERMINAL and state != State.DRAINING:
            moves.add((state, State.DRAINING))  # tick() drains every live state on SIGTERM
    # tick() stops a RUNNING group whose slot was lost.
    moves.add((State.RUNNING, State.STOPPING))
    return moves


def test_every_move_in_the_code_is_in_the_table_and_every_entry_is_used() -> None:
    table = {(frm, to) for frm, targets in TRANSITIONS.items() for to in targets}
    in_code = _moves_in_code()
    assert in_code - table == set(), "handlers return states the table does not allow"
    assert table - in_code == set(), "the table lists moves no handler makes"


def test_the_docstring_diagram_is_the_table() -> None:
    doc = supervisor.__doc__ or ""
    assert textwrap.indent(diagram(), "    ") in doc


def test_the_architecture_doc_shows_the_table() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    assert "```\n" + diagram() + "\n```" in doc


def test_terminal_states_go_nowhere_and_draining_only_ends() -> None:
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert TRANSITIONS[State.DRAINING] == {State.DONE}
    assert allowed(State.RUNNING, State.RUNNING)
    assert not allowed(State.DONE, State.RUNNING)


def test_a_move_outside_the_table_raises(tmp_path: object) -> None:
    sup = object.__new__(supervisor.Supervisor)  # only move() is exercised
    sup.view = NodeView(state=State.DONE)
    sup.note = {}
    with pytest.raises(IllegalTransition, match="DONE -> RUNNING"):
        sup.move(State.RUNNING)


def test_every_live_state_has_its_handler_and_no_other_state_has_one() -> None:
    """The supervisor finds a state's handler in one explicit table, not by name."""
    handlers = supervisor.HANDLERS
    assert set(handlers) == set(State) - set(TERMINAL)
    assert all(getattr(supervisor.Supervisor, h.__name__) is h for h in handlers.values())
