"""Site profiles are validated: unknown keys, wrong types and missing fields name file and key."""

import pytest

from ddl.errors import UsageError
from ddl.sites import get_site, known_sites

pytestmark = pytest.mark.unit

GOOD = 'name = "{name}"\ndescription = "x"\naccelerator = "cpu"\nbackend = "gloo"\n'


def test_local_profile_ships():
    site = get_site("local")
    assert site.accelerator == "cpu" and site.backend == "gloo"
    assert site.defaults.nproc == 2 and site.defaults.synthetic_if_missing


@pytest.mark.parametrize("body, needle", [
    (GOOD + "gpus = 4\n", "gpus: unknown key; allowed: accelerator, backend, container, cpu_binding"),
    (GOOD + "[defaults]\nnprocs = 2\n", "defaults.nprocs: unknown key; allowed: data_dir, nproc"),
    (GOOD.replace('"gloo"', '"mpi"'), "backend: Input should be 'gloo' or 'nccl' (got 'mpi')"),
    (GOOD + "[defaults]\nnproc = \"four\"\n", "defaults.nproc: Input should be a valid integer"),
    (GOOD.replace('accelerator = "cpu"\n', ""), "accelerator: Field required"),
    ('name = "bad\n', "not a readable TOML file"),
])
def test_invalid_profile_names_file_and_key(tmp_path, monkeypatch, body, needle):
    (tmp_path / "bad.toml").write_text(body.format(name="bad"))
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    with pytest.raises(UsageError) as info:
        get_site("bad")
    message = str(info.value)
    assert str(tmp_path / "bad.toml") in message and needle in message, message
    assert "\n" not in message


def test_extra_directory_is_searched_first(tmp_path, monkeypatch):
    (tmp_path / "mine.toml").write_text(GOOD.format(name="mine"))
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    assert "mine" in known_sites() and "local" in known_sites()
    assert get_site("mine").source == str(tmp_path / "mine.toml")


def test_plugin_hook_adds_a_directory(tmp_path):
    from types import SimpleNamespace

    from ddl.hookspecs import hookimpl
    from ddl.plugins import Plugins

    (tmp_path / "vendor.toml").write_text(GOOD.format(name="vendor"))

    @hookimpl
    def ddl_site_dirs():
        return [tmp_path]

    plugins = Plugins(load_entry_points=False)
    plugins.register(SimpleNamespace(ddl_site_dirs=ddl_site_dirs), "vendor-sites")
    assert get_site("vendor", plugins).source == str(tmp_path / "vendor.toml")
    with pytest.raises(UsageError, match="unknown site 'vendor'"):
        get_site("vendor")  # not without the plugin
