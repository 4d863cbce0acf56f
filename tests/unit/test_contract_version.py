"""The contract is versioned: a plugin may declare the versions it supports in its spec, and
`ddl plugins` says in one line when this ddl's version is outside them (naming both), lists
the plugin all the same, and sets a malformed declaration aside as BROKEN."""

from __future__ import annotations

import pytest

from conftest import install_plugin, run_ddl
from ddl.contract import CONTRACT_VERSION
from ddl.contract.version import parse_range

pytestmark = pytest.mark.unit

MAJOR = int(CONTRACT_VERSION.split(".")[0])

WORKLOAD = """
from ddl.contract import Preset, WorkloadSpec, hookimpl

@hookimpl
def ddl_register_workloads():
    preset = Preset("p", "a preset", epochs=1, batch_size=1, lr=0.1)
    return [WorkloadSpec("{name}", "about {name}", "nowhere:Nothing", {{"p": preset}}, "p",
                         contract={contract!r})]
"""
STRATEGY = """
from ddl.contract import StrategySpec, hook_returning

ddl_register_strategies = hook_returning(
    StrategySpec("{name}", "about {name}", "nowhere:Nothing", contract={contract!r}))
"""


@pytest.mark.parametrize("declared, problem", [
    (str(MAJOR), None),
    (f"{MAJOR}.0", None),
    (f"{MAJOR - 1}-{MAJOR}", None),
    (f"{MAJOR + 1}", f"targets ddl contract {MAJOR + 1}; this ddl has contract {CONTRACT_VERSION}"),
    (f"{MAJOR - 1}", f"targets ddl contract {MAJOR - 1}; this ddl has contract {CONTRACT_VERSION}"),
    (f"{MAJOR + 1}-{MAJOR + 2}", f"targets ddl contract {MAJOR + 1}-{MAJOR + 2}; "),
    (f"{MAJOR}.99", f"needs ddl contract {MAJOR}.99 or later; this ddl has contract "
                    f"{CONTRACT_VERSION}"),
])
def test_a_declared_range_names_what_is_outside_it(declared, problem):
    found = parse_range(declared).problem()
    assert found == problem if problem is None else found.startswith(problem), found


@pytest.mark.parametrize("declared", ["two", "2.x", ">=2", "3-2", "2.1.0", ""])
def test_a_malformed_range_is_refused_naming_the_forms(declared):
    with pytest.raises(ValueError, match=r"allowed: '2' \(any 2\.x\)"):
        parse_range(declared)


def test_ddl_plugins_names_a_plugin_for_another_major_in_one_line(tmp_path):
    """Installed third-party plugins: one for the next major (a workload), one for this
    major (a strategy), one with a malformed declaration. Only the first gets a line; all
    but the malformed one are listed as usual."""
    site = tmp_path / "site"
    env = install_plugin(site, "future_plugin", WORKLOAD.format(
        name="futurework", contract=str(MAJOR + 1)))
    install_plugin(site, "current_plugin", STRATEGY.format(
        name="currentstrat", contract=f"{MAJOR}.0"))
    install_plugin(site, "garbled_plugin", WORKLOAD.format(name="garbled", contract="two"))
    proc = run_ddl("plugins", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    notes = [line for line in lines if line.startswith("CONTRACT ")]
    assert notes == [f"CONTRACT plugin 'future_plugin' (future-plugin 1.0) targets ddl contract "
                     f"{MAJOR + 1}; this ddl has contract {CONTRACT_VERSION}; it may fail to "
                     "load or train with this ddl"], proc.stdout
    listed = [line.split()[0] for line in lines if line.startswith("  ") and line.split()]
    assert "futurework" in listed and "currentstrat" in listed and "garbled" not in listed
    broken = [line for line in lines if line.startswith("BROKEN plugin 'garbled_plugin'")]
    assert len(broken) == 1 and "contract 'two' is not a version range; allowed:" in broken[0]
