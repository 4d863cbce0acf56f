"""docs/plugins.md names every public name of the contract: the names of ddl.contract.__all__,
every public method and attribute of Workload and Strategy, the fields of the specs and of
the two contexts, and the conformance kit's entry points. Read from the code, so a name
added without its line on that page fails here."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


def public_names() -> set[str]:
    import ddl.conformance
    import ddl.contract
    from ddl.contract import (
        Preset,
        RunContext,
        Strategy,
        StrategyContext,
        StrategySpec,
        Workload,
        WorkloadSpec,
    )

    names = set(ddl.contract.__all__) | set(ddl.conformance.__all__)
    for cls in (Workload, Strategy):
        names |= {n for n in vars(cls) if not n.startswith("_")}
    for cls in (Preset, WorkloadSpec, StrategySpec, RunContext, StrategyContext):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names - {"plugin"}  # filled in by the plugin manager, not by a plugin


def undocumented(text: str) -> list[str]:
    return sorted(n for n in public_names() if not re.search(rf"(?<!\w){n}(?!\w)", text))


def test_the_contract_page_names_every_public_name():
    missing = undocumented((REPO / "docs" / "plugins.md").read_text())
    assert not missing, f"docs/plugins.md does not name: {missing}"


def test_a_page_without_a_name_is_caught():
    text = (REPO / "docs" / "plugins.md").read_text().replace("lr_step_factor", "lr_x")
    assert undocumented(text) == ["lr_step_factor"]
