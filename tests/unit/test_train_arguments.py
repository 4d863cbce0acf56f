"""Train flags written back as arguments, for the `ddl train` of a batch job (`ddl submit`)
or of a scaling point (`ddl scale`): the job parses what the user gave, paths absolute."""

import pytest

from ddl.commands.cli import main
from ddl.commands.flags import train_arguments
from ddl.commands.parser import make_parser

pytestmark = pytest.mark.unit

GIVEN = ["--plugin", "mnist", "--mesh", "dp=2,tp=2", "--strategy-option", "a=1",
         "--strategy-option", "b=x=y", "--data-dir", "data", "--lr", "0.5", "--profile"]


def _train_flags(args: list[str]) -> dict:
    flags = vars(make_parser().parse_args(["train", *args]))
    del flags["command"]
    return flags


@pytest.mark.parametrize("options_as_dict", [False, True])  # scale keeps argparse's pairs
def test_written_back_arguments_parse_to_the_same_flags(options_as_dict, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = _train_flags(GIVEN)
    if options_as_dict:
        flags["strategy_options"] = dict(flags["strategy_options"])
    args = train_arguments(flags)
    assert f"--data-dir={tmp_path / 'data'}" in args  # the job may start elsewhere
    again = _train_flags(args)
    assert again == {**_train_flags(GIVEN), "data_dir": tmp_path / "data"}


def test_left_out_flags_are_not_written():
    flags = _train_flags(["--site", "local", "--nproc", "2", "--epochs", "3"])
    assert train_arguments(flags, leave_out=("site", "nproc")) == ["--epochs=3"]


@pytest.mark.parametrize("command", ["submit", "scale"])
def test_job_line_carries_the_config_file_and_flags(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text('plugin = "mnist"\n')
    code = main([command, "--site", "juwels-booster", "--nodes", "1", "--dry-run",
                 "--account", "proj", "--config", "run.toml", "--mesh", "dp=4",
                 "--strategy-option", "bucket_cap_mb=9", "--output-dir" if command == "submit"
                 else "--output", str(tmp_path / "out")])
    assert code == 0
    script = capsys.readouterr().out
    job_line = next(line for line in script.splitlines() if "--config=" in line)
    assert f"--config={tmp_path / 'run.toml'}" in job_line
    assert "--mesh=dp=4" in job_line and "--strategy-option=bucket_cap_mb=9" in job_line
