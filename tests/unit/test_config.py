"""Run configuration: merge order and one-line validation messages."""

from pathlib import Path

import pytest

from ddl.settings.batch import BatchSplit, resolve_batch
from ddl.settings.config import RunConfig, build, load_config_file, scaled_lr
from ddl.contract.errors import UsageError

pytestmark = pytest.mark.unit


def test_flags_override_file_override_site(tmp_path):
    built = build({"site": "local"}, {}, None)
    assert built.config.nproc == 2 and built.config.workers == 0  # from sites/local.toml
    assert built.data_dir_is_default and built.config.data_dir == Path("data")
    config = build({"nproc": 3}, {"nproc": 4, "epochs": 7}, None).config
    assert config.nproc == 3 and config.epochs == 7
    built = build({"data_dir": tmp_path}, {}, None)
    assert not built.data_dir_is_default and built.config.data_dir == tmp_path


@pytest.mark.parametrize("flags, needle", [
    ({"nproc": 0}, "--nproc: Input should be greater than or equal to 1 (got 0)"),
    ({"warmup_steps": 2, "warmup_epochs": 1}, "not both"),
    ({"lr_scaling": "square"}, "--lr-scaling: Input should be 'none' or 'linear'"),
    ({"site": "nowhere"}, "--site: unknown site 'nowhere'; allowed: "),
])
def test_bad_values_give_one_line(flags, needle):
    with pytest.raises(UsageError) as info:
        build(flags, {}, None)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_config_file_unknown_key(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("epochs = 3\nepoch = 4\n")
    with pytest.raises(UsageError, match="unknown key 'epoch'; allowed: .*epochs"):
        load_config_file(path)
    path.write_text("epochs = [\n")
    with pytest.raises(UsageError, match="not a readable TOML file"):
        load_config_file(path)


def test_batch_resolution_and_linear_scaling():
    config = RunConfig(global_batch_size=256)
    assert resolve_batch(config, 100, 4) == BatchSplit(64, 1, 64, 256)
    with pytest.raises(UsageError, match="not divisible by the 3 data-parallel replicas"):
        resolve_batch(config, 100, 3)
    assert resolve_batch(RunConfig(), 100, 4) == BatchSplit(100, 1, 100, 400)
    assert resolve_batch(RunConfig(batch_size=10), 100, 4) == BatchSplit(10, 1, 10, 40)
    # both flags: global / (batch x replicas) micro-steps per optimizer step
    both = RunConfig(batch_size=8, global_batch_size=96)
    assert resolve_batch(both, 100, 4) == BatchSplit(8, 3, 24, 96)
    assert resolve_batch(both, 100, 12) == BatchSplit(8, 1, 8, 96)
    with pytest.raises(UsageError) as info:
        resolve_batch(both, 100, 8)  # 8 x 8 = 64 does not divide 96
    assert str(info.value) == ("--global-batch-size: 96 is not a multiple of --batch-size 8 "
                               "x 8 data-parallel replica(s) = 64, so no whole number of "
                               "micro-steps makes it; allowed: multiples of 64")
    # the CTE-POWER course: lr 0.01 x number of GPUs when the batch grows with them
    assert scaled_lr(RunConfig(lr_scaling="linear"), 0.01, 1024, 256) == pytest.approx(0.04)
    assert scaled_lr(RunConfig(), 0.01, 1024, 256) == 0.01


@pytest.mark.parametrize("text, needle", [
    ("epochs = true\n", "--epochs: Input should be a valid integer (got True)"),
    ('lr = "0.1"\n', "--lr: Input should be a valid number (got '0.1')"),
    ("sync_bn = 1\n", "--sync-bn: Input should be a valid boolean (got 1)"),
    ("nproc = 2.0\n", "--nproc: Input should be a valid integer (got 2.0)"),
    ('run_dir = ""\n', "--run-dir: an empty path would mean the current directory"),
    ("mesh = {dp = 0}\n", "--mesh: Input should be greater than or equal to 1 (got 0)"),
])
def test_config_file_values_are_taken_as_written(tmp_path, text, needle):
    """Issue 43: `epochs = true` was 1 epoch, `run_dir = ""` the current directory."""
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        build({}, load_config_file(path), None)
    assert needle in str(info.value), str(info.value)


def test_config_file_paths_and_whole_seconds_still_read(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('hang_timeout = 4\nrun_dir = "r"\ndata_dir = "d"\nlr = 1\n')
    config = build({}, load_config_file(path), None).config
    assert (config.hang_timeout, config.run_dir, config.data_dir, config.lr) == \
        (4.0, Path("r"), Path("d"), 1.0)
