"""Property: whatever a user types or writes into a site profile, no traceback reaches them.

Hypothesis generates command lines for train, submit, prepare, sites and doctor (the real
flags, read from the parser, with values that fit them or not: odd unicode, undecodable
bytes as Python's argv carries them, negative and huge numbers, empty strings; plus made-up
flags and stray words), run-config files for --config, and site profiles (the shipped ones
with keys dropped, added or given values of the wrong kind, or the TOML text damaged).
Every outcome must be a success (exit 0, nothing on stderr) or exactly one line on stderr
with exit code 2; `ddl doctor` may also report failed checks (exit 1, on stdout).

`ddl.commands.cli.main` runs in-process for speed, with stdout and stderr encoded as on a UTF-8
terminal (strict for stdout, backslashreplace for stderr, as Python does), so text that
cannot be printed fails here as it would for a user. Nothing can start training or submit
a job: train always ends with a --data-dir that does not exist (the best case stops in the
preflight), prepare with a --data-dir that is a file, submit with --dry-run; Slurm and
launcher variables are removed from the environment.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import (HealthCheck, currently_in_test_context, event, example, given,
                        settings)
from hypothesis import strategies as st

from ddl.commands.cli import main
from ddl.commands.parser import make_parser
from ddl.settings.config import RunConfig
from ddl.contract.plugins import Plugins
from ddl.settings.sites import SITE_PATH_ENV, known_sites

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# --- running the CLI and judging the outcome -------------------------------------------

@dataclass
class Outcome:
    argv: list[str]
    code: int
    stdout: str
    stderr: str


def run(argv: list[str]) -> Outcome:
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="backslashreplace")
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --help and --version leave this way
            code = exc.code if isinstance(exc.code, int) else 2
        # Any other exception propagates and fails the test: it would be a traceback.
        out.flush()
        err.flush()
    return Outcome(argv, code, out_bytes.getvalue().decode(), err_bytes.getvalue().decode())


def assert_clean(o: Outcome, *, may_report_failures: bool = False) -> None:
    """Exit 0 and a stderr silent but for `ddl: note:` and `ddl: warning:` lines (e.g.
    submit's "the image's target was not checked", or that this installation's torch
    cannot drive the site's GPUs), or exactly one `ddl: error:` line and exit 2."""
    # Which kinds of outcome the examples reached (--hypothesis-show-statistics).
    if currently_in_test_context():
        what = re.sub(r"^ddl: error: (/\S+: )?([^:]{0,30}).*", r"\2", o.stderr.strip())
        event(f"{o.argv[0]}: exit {o.code} {what}")
    assert "Traceback" not in o.stdout + o.stderr, o
    lines = o.stderr.splitlines()
    if o.code == 0:
        assert all(line.startswith(("ddl: note: ", "ddl: warning: ")) for line in lines), o
    elif o.code == 1 and may_report_failures:  # doctor's failed checks, one per line
        assert o.stderr == "" and "FAIL" in o.stdout, o
    else:
        assert o.code == 2, o
        assert len(lines) == 1 and lines[0].startswith("ddl: error: "), o


@pytest.fixture(scope="module", autouse=True)
def quiet_environment(tmp_path_factory):
    """No Slurm job, launcher or site search path may steer the commands under test."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_", "DDL_")) or key in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            del os.environ[key]
    cwd = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # relative paths (runs/, data/) land here
    yield
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("props")
    (root / "a-file").write_text("not a directory\n")
    return root


# --- values and TOML ----------------------------------------------------------------------

PLUGINS = Plugins()
NAMES = sorted({*PLUGINS.workloads(), *PLUGINS.strategies(), *known_sites(PLUGINS)})
GOOD = st.sampled_from([*NAMES, "auto", "none", "tiny", "course", "cpu", "cuda", "linear",
                        "fp32", "bf16", "list", "show", "dp=2,tp=2", "dp=0", "dp=2,dp=4",
                        "k=v", "=v",
                        "01:00:00", "1-00", "99:99", "1", "0", "-1", "2", "0.5", ""])
NUMBERS = st.one_of(st.integers(-10**30, 10**30).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr))
UNICODE = st.text(st.characters(blacklist_characters="\x00"), max_size=12)  # argv has no NUL
# Bytes that are not UTF-8 reach sys.argv as lone surrogates (PEP 383).
UNDECODABLE = st.text(st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
                      min_size=1, max_size=3)
NASTY = st.sampled_from(["\n", "\r", "'", '"', "$(x)", "`x`", ";", " ", "\\", "-", "--",
                         "\x1b[31m", "\u202e", "é", "🙂", "\t"])
MIXED = st.lists(st.one_of(GOOD, NASTY, UNICODE), min_size=2, max_size=4).map("".join)
VALUE = st.one_of(GOOD, NUMBERS, UNICODE, MIXED, GOOD, NUMBERS, UNICODE, MIXED, UNDECODABLE)
SCALAR = st.one_of(st.booleans(), st.integers(-10**20, 10**20),
                   st.floats(allow_nan=True, allow_infinity=True), VALUE)
ANY = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def toml_value(value) -> str:
    """Inline TOML for generated data (tomllib only reads)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # inf, -inf, nan and 1e+300 are TOML as Python writes them
    if isinstance(value, str):
        return json.dumps(value)  # JSON escapes are TOML escapes (\udcff is rejected: fine)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(data: dict) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


@st.composite
def damaged(draw, text: str) -> bytes:
    """The text as a file, sometimes cut short or followed by junk (text or raw bytes)."""
    blob = text.encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "text", "bytes"]))
    if damage == "truncate":
        return blob[:draw(st.integers(0, len(blob)))]
    if damage == "text":
        return blob + draw(st.text(max_size=20)).encode("utf-8", "surrogatepass")
    if damage == "bytes":
        return blob + draw(st.binary(min_size=1, max_size=8))
    return blob


# --- generated command lines -------------------------------------------------------------

CONFIG = "<generated config file>"  # replaced by the path of a generated --config file


def _options(command: str) -> list[argparse.Action]:
    parser = make_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    # --help is left out: it ends every command line it is on (tokens adds it rarely).
    return [a for a in sub._actions if any(o.startswith("--") for o in a.option_strings)
            and not isinstance(a, argparse._HelpAction)]


def _values_for(action: argparse.Action) -> st.SearchStrategy[str]:
    """Mostly values of the flag's own kind (so examples get past argparse), sometimes any."""
    if "--config" in action.option_strings:
        fitting = st.just(CONFIG)
    elif action.choices:
        fitting = st.sampled_from(sorted(action.choices))
    elif action.type is int:
        fitting = st.one_of(st.integers(1, 8), st.integers(-10**30, 10**30),
                            st.sampled_from(_edges(action.dest))).map(str)
    elif action.type is float:
        fitting = st.one_of(st.sampled_from(["1", "0.5", "300", "0.001", "1e308"]), NUMBERS,
                            st.sampled_from(_edges(action.dest)).map(str))
    else:
        fitting = GOOD
    return st.one_of(fitting, fitting, fitting, VALUE)


def _bounds(name: str) -> tuple[float | None, float | None]:
    """(lowest, highest) a RunConfig number may be, from its Field's ge/gt and le/lt."""
    low = high = None
    for rule in getattr(RunConfig.model_fields.get(name), "metadata", []):
        low = next((getattr(rule, k) for k in ("ge", "gt") if hasattr(rule, k)), low)
        high = next((getattr(rule, k) for k in ("le", "lt") if hasattr(rule, k)), high)
    return low, high


def _edges(name: str) -> list:
    """A number flag's bounds and the values just past them."""
    edges = []
    for bound, step in zip(_bounds(name), (-1, 1)):
        if bound is not None:
            edges += [bound, bound + step, bound * 2 + step]
    return edges or [0, -1]


def tokens(command: str, leave_out: tuple[str, ...] = ()) -> st.SearchStrategy[list[str]]:
    """A few flags, each as `--flag VALUE`, `--flag=VALUE` or bare; now and then a made-up
    flag or a stray word. ``leave_out``: flags never drawn."""
    options = [a for a in _options(command) if not set(a.option_strings) & set(leave_out)]

    @st.composite
    def one(draw) -> list[str]:
        kind = draw(st.sampled_from(["real"] * 8 + ["made-up", "word"]))
        if kind == "word":
            return [draw(VALUE)]
        if kind == "made-up":
            return [draw(st.one_of(st.text(max_size=8).map(lambda s: "--" + s), VALUE,
                                   st.just("--help")))]
        action = draw(st.sampled_from(options))
        name = draw(st.sampled_from([o for o in action.option_strings if o.startswith("--")]))
        if action.nargs == 0:  # switches (--dry-run, --synthetic, --help)
            return [name] if draw(st.integers(0, 9)) else [f"{name}={draw(VALUE)}"]
        value = draw(_values_for(action))
        return [f"{name}={value}"] if draw(st.booleans()) else [name, value]

    return st.lists(one(), max_size=5).map(lambda parts: [t for p in parts for t in p])


@st.composite
def config_files(draw) -> bytes:
    """A --config file: run-config keys (and some unknown ones) with any values."""
    keys = st.one_of(st.sampled_from(sorted(RunConfig.model_fields)), st.text(max_size=8))
    data = draw(st.dictionaries(keys, ANY, max_size=4))
    return draw(damaged(toml_document(data)))


def _with_config(argv: list[str], scratch: Path, config: bytes) -> list[str]:
    path = scratch / "run.toml"
    path.write_bytes(config)
    return [a.replace(CONFIG, str(path)) for a in argv]


def _help_asked(args: list[str]) -> bool:
    # exactly -h or --help: the parsers take no abbreviations (issue 52), so --he is refused
    return any(a in ("-h", "--help") for a in args)


@SETTINGS
@given(args=tokens("train"), config=config_files())
@example(args=["--data-dir", "a\nb"], config=b"")
@example(args=["--rendezvous-timeout", "inf"], config=b"")
@example(args=["--run-dir", "\udcff"], config=b"")
@example(args=["--config", CONFIG], config=b'seed = "\xff"\n')
# issue 43's shapes: an empty run dir, a hang timeout too short to work, a warm-up too long
# to count, duplicate mesh names, a boolean for a number
@example(args=["--run-dir", ""], config=b"")
@example(args=["--run-dir="], config=b"")
@example(args=["--config", CONFIG], config=b'run_dir = ""\n')
@example(args=["--hang-timeout", "0.001"], config=b"")
@example(args=["--warmup-epochs", "1e308"], config=b"")
@example(args=["--mesh", "dp=2,dp=4"], config=b"")
@example(args=["--config", CONFIG], config=b"epochs = true\n")
def test_train_arguments(scratch, args, config):
    # A --data-dir that does not exist keeps the best case at the preflight (exit 2).
    argv = ["train", *args, "--data-dir", str(scratch / "no-such-dir"), "--nproc", "1"]
    outcome = run(_with_config(argv, scratch, config))
    assert_clean(outcome)
    assert outcome.code == 2 or _help_asked(args), outcome  # never trains


@SETTINGS
@given(args=tokens("submit"), config=config_files(),
       site=st.sampled_from(["jureca-dc", "lumi-g", "local-slurm", "mn5-acc", "local"]))
@example(args=["--ddl-command", "\udcff"], config=b"", site="jureca-dc")
@example(args=["--time", "\n"], config=b"", site="lumi-g")
@example(args=["--container", "\r"], config=b"", site="jureca-dc")
def test_submit_arguments(scratch, args, config, site):
    argv = ["submit", "--site", site, *args, "--dry-run"]
    assert_clean(run(_with_config(argv, scratch, config)))


@SETTINGS
@given(args=tokens("prepare"))
def test_prepare_arguments(scratch, args):
    # --data-dir naming a file: the best case is a rejection before anything is written.
    outcome = run(["prepare", *args, "--data-dir", str(scratch / "a-file")])
    assert_clean(outcome)
    assert outcome.code == 2 or _help_asked(args), outcome


@SETTINGS
@given(command=st.sampled_from(["sites", "doctor"]), data=st.data())
def test_sites_and_doctor_arguments(command, data):
    if command == "sites":
        words = st.one_of(st.sampled_from(["list", "show", *NAMES]), VALUE)
        argv = ["sites", *data.draw(st.lists(words, max_size=3))]
    else:
        # not --collectives: with valid values it measures the gloo links for real (up to 8
        # processes on 2 cores, 30 s to minutes an example: this test took 22-209 s);
        # test_doctor_collectives.py runs it
        argv = ["doctor", *data.draw(tokens("doctor", leave_out=("--collectives",)))]
    assert_clean(run(argv), may_report_failures=command == "doctor")


@pytest.mark.parametrize("argv", [["doctor", "--data-dir", "\ud800"],  # found by the above
                                  ["sites", "show", "\udcff"], ["train", "--plugin=x\udcff"]])
def test_text_that_cannot_be_printed_is_rejected(argv):
    outcome = run(argv)
    assert_clean(outcome)
    assert outcome.code == 2 and "not valid UTF-8" in outcome.stderr, outcome


@pytest.mark.parametrize("flag, value", [("--lr", "inf"), ("--warmup-epochs", "inf"),
                                         ("--seed", str(2**64)), ("--rendezvous-timeout", "inf"),
                                         # issue 43
                                         ("--run-dir", ""), ("--hang-timeout", "0.001"),
                                         ("--warmup-epochs", "1e308"), ("--lr", "1e308"),
                                         ("--clip-grad-norm", "1e308"),
                                         ("--mesh", "dp=2,dp=4")])
def test_values_workers_could_not_use_are_rejected(scratch, flag, value):
    """Found reading the generated cases: these passed the preflight and would fail (or
    diverge) only in the workers."""
    outcome = run(["train", flag, value, "--nproc", "1", "--data-dir", str(scratch / "none")])
    assert_clean(outcome)
    assert outcome.code == 2 and flag in outcome.stderr, outcome


NUMBER_FLAGS = sorted(a.dest for a in _options("train") if a.type in (int, float))


def test_every_number_flag_has_a_range():
    """Issue 43: each number a run takes has a lowest and a highest value (docs/
    getting-started.md), so that none passes the pre-flight and fails in the workers."""
    assert NUMBER_FLAGS and "hang_timeout" in NUMBER_FLAGS
    unbounded = [name for name in NUMBER_FLAGS if None in _bounds(name)]
    assert not unbounded, f"number flags without a lowest and highest value: {unbounded}"


@pytest.mark.parametrize("name", NUMBER_FLAGS)
def test_a_number_past_its_range_is_refused_by_the_preflight(scratch, name):
    high = _bounds(name)[1]
    flag = "--" + name.replace("_", "-")
    outcome = run(["train", "--nproc", "1", "--data-dir", str(scratch / "none"),
                   flag, str(high * 2 + 1)])  # last: it wins over the --nproc 1
    # (doubled: a float as large as 1e30 does not change by adding 1)
    assert_clean(outcome)
    assert outcome.code == 2 and f"error: {flag}: " in outcome.stderr, outcome


def test_negative_gpus_per_node_is_rejected():
    outcome = run(["submit", "--site", "jureca-dc", "--gpus-per-node", "-1", "--dry-run"])
    assert_clean(outcome)
    assert outcome.code == 2 and "--gpus-per-node" in outcome.stderr, outcome


# --- generated site profiles ------------------------------------------------------------

SHIPPED = {name: tomllib.loads(path.read_text(encoding="utf-8"))
           for name, path in known_sites().items()}


@st.composite
def profiles(draw) -> tuple[str, bytes]:
    """(site name, file contents): a shipped profile, changed a few times."""
    base = draw(st.sampled_from(sorted(SHIPPED)))
    data = json.loads(json.dumps(SHIPPED[base]))  # a deep copy
    for _ in range(draw(st.integers(0, 3))):
        table = data  # walk down to some table, then replace, delete or add a key there
        while True:
            subtables = [k for k, v in table.items() if isinstance(v, dict)]
            if not subtables or draw(st.booleans()):
                break
            table = table[draw(st.sampled_from(subtables))]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action != "add" and table:
            key = draw(st.sampled_from(sorted(table)))
            if action == "delete":
                del table[key]
            else:
                table[key] = draw(ANY)
        else:
            table[draw(st.one_of(st.text(max_size=8), st.sampled_from(["name", "env"])))] = \
                draw(ANY)
    name = draw(st.one_of(st.just(base), st.just(base),
                          st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)))
    if draw(st.booleans()):
        data["name"] = name  # usually consistent with the file name, sometimes not
    return name, draw(damaged(toml_document(data)))


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sites")


@settings(SETTINGS, max_examples=100)  # each example runs four commands
@given(profile=profiles())
@example(profile=("bad", b'name = "bad"\ndescription = "x"\n\xff'))
@example(profile=("lumi-g", toml_document({**SHIPPED["lumi-g"],
                                           "env": {"A": 'x"y'}}).encode()))
@example(profile=("lumi-g", toml_document({**SHIPPED["lumi-g"],
                                           "setup": ["if then"]}).encode()))
def test_site_profiles(site_dir, profile):
    name, contents = profile
    shutil.rmtree(site_dir)
    site_dir.mkdir()
    (site_dir / f"{name}.toml").write_bytes(contents)
    os.environ[SITE_PATH_ENV] = str(site_dir)
    try:
        listing = run(["sites"])
        assert_clean(listing)
        assert listing.code == 0, listing  # a broken profile is listed as INVALID
        assert_clean(run(["sites", "show", name]))
        assert_clean(run(["submit", "--dry-run", "--site", name]))
        assert_clean(run(["doctor", "--site", name]), may_report_failures=True)
    finally:
        del os.environ[SITE_PATH_ENV]


def test_the_harness_sees_both_outcomes():
    """Guard against a vacuous property: success and rejection both look as expected."""
    assert run(["submit", "--site", "jureca-dc", "--dry-run"]).code == 0
    rejected = run(["train", "--nproc", "0"])
    assert rejected.code == 2 and re.match(r"ddl: error: --nproc", rejected.stderr), rejected
