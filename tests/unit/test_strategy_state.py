"""Strategies keep nothing between calls, and layouts need no classes of their own.

A strategy object is its options: what a call needs comes in the run's StrategyContext
(ddl.contract.strategy), what a built parallelism remembers lives on the wrapped model. The
check reads the source: an assignment to ``self.<name>`` outside ``__init__`` in any
shipped strategy (or the base class) is state carried from one call to the next. Planted
violations show the check can fail.
"""

import ast
import inspect
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

STRATEGIES = Path(__file__).resolve().parents[2] / "packages/plugins/strategies/src/ddl_strategies"


def _state_writes(source: str) -> list[str]:
    """``Class.method: self.name`` for every assignment to an attribute of ``self`` made
    outside ``__init__``."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for method in cls.body:
            if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
                continue
            for node in ast.walk(method):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                           else [])
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Attribute) and \
                                isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                            found.append(f"{cls.name}.{method.name}: self.{leaf.attr}")
    return found


def _strategy_sources() -> dict[str, str]:
    from ddl.contract import strategy

    sources = {"ddl/contract/strategy.py": inspect.getsource(strategy)}
    for path in sorted(STRATEGIES.glob("*.py")):
        source = path.read_text()
        if "(Strategy)" in source or "(MeshStrategy)" in source:
            sources[path.name] = source
    return sources


def test_no_strategy_stores_anything_between_calls():
    sources = _strategy_sources()
    assert {"compose.py", "shorthands.py", "accelerate.py"} <= set(sources)
    writes = {name: _state_writes(source) for name, source in sources.items()}
    assert not any(writes.values()), writes


@pytest.mark.parametrize("planted", [
    "class S(Strategy):\n    def check(self, run):\n        self.workload = run.workload\n",
    "class S(Strategy):\n    def wrap(self, model, run):\n        self.n += 1\n",
    "class S(Strategy):\n    def wrap(self, model, run):\n        self.a, (self.b, c) = 1, (2, 3)\n",
])
def test_the_check_finds_planted_state(planted):
    assert _state_writes(planted)


def test_every_layout_is_the_one_recipe():
    """Each shipped strategy but Accelerate (its own engine) is ddl_strategies.compose's
    class: pp x fsdp, pp x tp and 3-D are layouts of it, with no module of their own."""
    from ddl.contract.plugins import Plugins
    from ddl.contract.specs import load_factory
    from ddl_strategies.compose import MeshStrategy

    shipped = {s.name: s for s in Plugins().strategies().values() if s.plugin == "strategies"}
    for name, spec in shipped.items():
        factory = load_factory(spec.factory)
        assert (name == "accelerate") != issubclass(factory, MeshStrategy), name
    modules = {p.stem for p in STRATEGIES.glob("*.py")}
    assert modules == {"__init__", "plugin", "compose", "shorthands", "ddp", "fsdp", "tp",
                       "pipeline", "gathered", "accelerate"}
