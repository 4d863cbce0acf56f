"""Plugins come from installed entry points (group `ddl`); a broken one is reported, not fatal."""

from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, assert_one_line_error, install_plugin, run_ddl
from ddl.contract.hookspecs import hookimpl
from ddl.contract.plugins import Plugins
from ddl.contract.specs import Preset, WorkloadSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name, dist, workloads", [
    ("mnist", "ddl-mnist", {"mnist"}), ("cifar", "ddl-cifar", {"cifar"}),
    ("imagewoof", "ddl-imagewoof", {"imagewoof"}), ("xsum", "ddl-xsum", {"xsum"}),
])
def test_every_shipped_workload_is_an_installed_entry_point(name, dist, workloads):
    """pluggy fails silently on groups never loaded: check each one arrives for real."""
    eps = {ep.name: ep for ep in metadata.entry_points(group="ddl")}
    assert eps[name].value == f"ddl_{name}.plugin" and eps[name].dist.name == dist
    found = {w.name for w in Plugins().workloads().values() if w.plugin == name}
    assert found == workloads


def test_shipped_strategies_are_installed_entry_points():
    eps = {ep.name: ep for ep in metadata.entry_points(group="ddl")}
    assert eps["strategies"].dist.name == "ddl-strategies"
    found = {s.name for s in Plugins().strategies().values() if s.plugin == "strategies"}
    assert found == {"mesh", "ddp", "fsdp", "accelerate", "pp", "tp", "fsdp+tp"}


def test_cli_sees_what_the_entry_points_provide():
    plugins = Plugins()
    mnist, ddp = plugins.workload("mnist"), plugins.strategy("ddp")
    # each spec is tagged with the entry point that registered it
    assert mnist.plugin == "mnist" and ddp.plugin == "strategies"
    assert plugins.version_of("mnist").startswith("ddl-mnist ")
    assert plugins.version_of("strategies").startswith("ddl-strategies ")
    assert not plugins.broken


def test_nothing_is_found_without_entry_points():
    plugins = Plugins(load_entry_points=False)
    assert plugins.workloads() == {} and plugins.strategies() == {}


def test_explicit_registration():
    @hookimpl
    def ddl_register_workloads():
        preset = Preset("p", "a preset", epochs=1, batch_size=1, lr=0.1)
        return [WorkloadSpec("toy", "a toy", "nowhere:Nothing", {"p": preset}, "p")]

    plugins = Plugins(load_entry_points=False)
    plugins.register(SimpleNamespace(ddl_register_workloads=ddl_register_workloads), "toy-plugin")
    assert plugins.workload("toy").plugin == "toy-plugin"


def _install_fake_distribution(root: Path, module_body: str) -> None:
    install_plugin(root, "broken_plugin_mod", module_body, entry="broken")


def test_broken_plugin_is_reported_and_the_rest_keep_working(tmp_path):
    _install_fake_distribution(tmp_path, "raise ImportError('needs libfoo, which is missing')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    proc = run_ddl("plugins", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "BROKEN plugin 'broken'" in proc.stdout
    assert "ImportError: needs libfoo, which is missing" in proc.stdout
    assert "mnist" in proc.stdout and "ddp" in proc.stdout

    proc = run_ddl("train", "--plugin", "broken", env=env)
    assert_one_line_error(proc, "--plugin", "'broken'", "failed to load", "allowed:", "mnist")


BARE_SPEC = """
from ddl.contract import Preset, WorkloadSpec, hookimpl

@hookimpl
def ddl_register_workloads():
    preset = Preset("p", "a preset", epochs=1, batch_size=1, lr=0.1)
    return WorkloadSpec("bare", "a bare spec", "nowhere:Nothing", {"p": preset}, "p")
"""


def test_a_hook_returning_a_bare_spec_is_named_and_set_aside(tmp_path):
    """A registration hook that returns one spec instead of a list: `ddl plugins` names the
    plugin and what it returned; the other plugins list and train as before."""
    _install_fake_distribution(tmp_path, BARE_SPEC)
    env = {"PYTHONPATH": str(tmp_path)}
    proc = run_ddl("plugins", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "BROKEN plugin 'broken'" in proc.stdout
    assert "returned a WorkloadSpec, not a list" in proc.stdout
    assert "entry point broken_plugin_mod" in proc.stdout  # where to look
    assert "mnist" in proc.stdout and "ddp" in proc.stdout
    assert proc.stdout.count("BROKEN plugin 'broken'") == 1

    proc = run_ddl("train", "--plugin", "bare", env=env)
    assert_one_line_error(proc, "--plugin", "'bare'", "allowed:", "mnist")


GENERATES = """
import sys
from dataclasses import replace

sys.path.insert(0, {src!r})
from ddl.contract import hookimpl
from ddl_example.plugin import ddl_register_workloads as example_specs
from ddl_example.workload import RegressionWorkload


class Generates(RegressionWorkload):
    # like a GPT author's corpus: prepare() always generates, nothing marks it synthetic
    def prepare(self, data_dir, *, synthetic):
        return super().prepare(data_dir, synthetic=True)

    def is_synthetic(self, data_dir):
        return False


@hookimpl
def ddl_register_workloads():
    return [replace(spec, name="gen", factory=Generates) for spec in example_specs()]
"""


def test_prepare_says_official_only_for_a_download(tmp_path):
    """`ddl prepare` calls data "official" only when the workload's data module downloaded
    it; a plugin whose own prepare() made it is not labelled official."""
    src = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"
    _install_fake_distribution(tmp_path / "site", GENERATES.format(src=str(src)))
    proc = run_ddl("prepare", "--plugin", "gen", "--data-dir", str(tmp_path / "data"),
                   env={"PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(official)" not in proc.stdout
    assert "ddl: gen data (as the plugin's prepare made it) ready in" in proc.stdout
