"""Site profiles are validated: unknown keys, wrong types and missing fields name file and key."""

import pytest

from ddl.contract.errors import UsageError
from ddl.settings.sites import get_site, known_sites

pytestmark = pytest.mark.unit

GOOD = 'name = "{name}"\ndescription = "x"\naccelerator = "cpu"\nbackend = "gloo"\n'


def test_local_profile_ships():
    site = get_site("local")
    assert site.accelerator == "cpu" and site.backend == "gloo"
    assert site.defaults.nproc == 2 and site.defaults.synthetic_if_missing


@pytest.mark.parametrize("body, needle", [
    (GOOD + "gpus = 4\n", "gpus: unknown key; allowed: accelerator, aliases, arch, backend, container"),
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

    from ddl.contract.hookspecs import hookimpl
    from ddl.contract.plugins import Plugins

    (tmp_path / "vendor.toml").write_text(GOOD.format(name="vendor"))

    @hookimpl
    def ddl_site_dirs():
        return [tmp_path]

    plugins = Plugins(load_entry_points=False)
    plugins.register(SimpleNamespace(ddl_site_dirs=ddl_site_dirs), "vendor-sites")
    assert get_site("vendor", plugins).source == str(tmp_path / "vendor.toml")
    with pytest.raises(UsageError, match="unknown site 'vendor'"):
        get_site("vendor")  # not without the plugin


@pytest.mark.parametrize("short, full", [("lumi", "lumi-g"), ("juwels", "juwels-booster"),
                                         ("jureca", "jureca-dc"), ("cte-power", "cte-power")])
def test_short_site_names_resolve_to_their_profiles(short, full):
    # The headline command says `--site lumi`; the profiles keep their full names.
    assert get_site(short).name == full


def test_alias_never_shadows_a_profile_name_and_the_first_claim_wins(tmp_path, monkeypatch):
    from ddl.settings.sites import aliases

    mine = GOOD.format(name="mine") + 'aliases = ["m", "local", "lumi"]\n'
    other = GOOD.format(name="other") + 'aliases = ["m"]\n'
    (tmp_path / "mine.toml").write_text(mine)
    (tmp_path / "other.toml").write_text(other)
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    assert get_site("m").name == "mine"  # the first claim in search order
    assert get_site("local").name == "local"  # a profile's own name is never an alias
    # an alias two profiles give: the one found first (DDL_SITE_PATH comes first) keeps it
    assert aliases()["lumi"] == "mine"


def test_an_invalid_profile_does_not_break_alias_lookup_of_others(tmp_path, monkeypatch):
    (tmp_path / "broken.toml").write_text('name = "broken"\n')
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    assert get_site("lumi").name == "lumi-g"


def test_unknown_site_lists_names_and_aliases():
    with pytest.raises(UsageError) as info:
        get_site("lumx")
    message = str(info.value)
    assert "unknown site 'lumx'" in message and "lumi (= lumi-g)" in message
    assert "juwels-booster" in message


def test_sites_listing_shows_the_short_names(capsys):
    from ddl.commands.cli import main

    assert main(["sites"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert rows["lumi-g"] == "lumi" and rows["juwels-booster"] == "juwels"
    assert rows["jureca-dc"] == "jureca" and rows["cte-power"] == "-"


def test_submit_with_a_short_name_renders_the_full_profile(capsys):
    from ddl.commands.cli import main

    assert main(["submit", "--site", "lumi", "--account", "project_1", "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "# Rendered by ddl" in script and "for site lumi-g:" in script
    assert "--site=lumi-g" in script  # the job names the profile, not the alias
    assert "#SBATCH --gpus-per-node=8" in script
