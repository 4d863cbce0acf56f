"""`ddl container check`: a broken definition file is caught before a long build, with one
line naming the file, the line and what is allowed. The shipped definitions pass.

Which problems the real Apptainer also rejects (and with which message) is shown against
the real runtime in tests/system/test_container.py.
"""

from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from ddl.launch.container_def import check, parse
from ddl.contract.errors import UsageError

pytestmark = pytest.mark.unit

GOOD = """\
# a comment before the header
Bootstrap: {{ BOOTSTRAP }}
From: {{ FROM }}

%arguments
    BOOTSTRAP=docker
    FROM=debian:12

%post
    echo "%not a section: the first word is echo"

%runscript
    exec ddl "$@"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.def"
    path.write_text(text)
    return path


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    (wh / "ddl-0.1.0-py3-none-any.whl").write_bytes(b"")
    return wh


@pytest.mark.parametrize("target", ["cpu", "cuda", "rocm"])
def test_shipped_definitions_pass(target, wheelhouse, tmp_path):
    """With a base that exists here (ROCm's default is a path on LUMI)."""
    base = tmp_path / "base"
    base.mkdir()
    proc = run_ddl("container", "check", "--target", target, "--wheelhouse", str(wheelhouse),
                   "--base", str(base))
    assert proc.returncode == 0, proc.stderr
    assert f"containers/{target}.def is fine" in proc.stdout


def test_good_definition_passes(tmp_path):
    stages = check(_write(tmp_path, GOOD))
    assert stages[0].bootstrap == "{{ BOOTSTRAP }}"
    assert [name for _, name, _ in stages[0].sections] == ["arguments", "post", "runscript"]


@pytest.mark.parametrize("text, line, needles", [
    (GOOD.replace("%post", "%psot"), 9, ["unknown section %psot", "allowed: %arguments"]),
    (GOOD.replace("%runscript", "  %Runscrpt"), 12, ["unknown section %runscrpt"]),
    ("%post\n    echo hi\n", 1, ["no header before the first section", "Bootstrap: AGENT"]),
    ("# only a comment\n\n%post\n    true\n", 3, ["no header"]),
    ("From: debian:12\n\n%post\n    true\n", 1, ["no 'Bootstrap:' line", "docker"]),
    ("Bootstrap: dokcer\nFrom: debian:12\n", 1, ["unknown bootstrap agent 'dokcer'",
                                                "localimage"]),
    ("Bootstrap: docker\nFrm: debian:12\n", 2, ["unknown header key 'frm'", "from"]),
    ("Bootstrap: docker\nFrom debian\n", 2, ["is not 'Key: value'"]),
    ("Bootstrap: docker\n\n%post\n    true\n", 1, ["'Bootstrap: docker' needs a 'From:'"]),
    ("Bootstrap: docker\nFrom: {{ BASE }}\n", 2, ["{{ BASE }} has no value",
                                                  "--build-arg BASE="]),
    ("Bootstrap: localimage\nFrom: /no/such/base\n", 2, ["localimage base /no/such/base "
                                                         "does not exist"]),
    ("Bootstrap: docker\nFrom: x\n%files\n    /no/such/wheels /opt/w\n", 4,
     ["%files source /no/such/wheels does not exist"]),
    ("Bootstrap: docker\nFrom: x\n%apprun\n    true\n", 3, ["%apprun needs an app name"]),
])
def test_broken_definition_is_one_clear_line(tmp_path, text, line, needles):
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as err:
        check(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_build_arguments_fill_templates_and_switch_the_base(tmp_path):
    base = tmp_path / "root"
    base.mkdir()
    path = _write(tmp_path, GOOD)
    check(path, {"BOOTSTRAP": "localimage", "FROM": str(base)})
    with pytest.raises(UsageError, match="localimage base .* does not exist"):
        check(path, {"BOOTSTRAP": "localimage", "FROM": str(tmp_path / "missing")})


def test_files_from_another_stage_are_not_looked_for_here(tmp_path):
    two_stages = ("Bootstrap: docker\nFrom: golang\nStage: build\n%post\n    true\n\n"
                  "Bootstrap: docker\nFrom: debian:12\nStage: final\n"
                  "%files from build\n    /root/app /usr/local/bin/app\n"
                  "%runscript\n    exec app\n")
    stages = check(_write(tmp_path, two_stages))
    assert len(stages) == 2 and stages[1].header["stage"][1] == "final"


@pytest.mark.parametrize("runscript, where", [
    ("", ""),  # none at all
    ("%runscript\n    # only a comment\n\n", ":5"),
])
def test_a_definition_whose_image_runs_nothing_fails_check(tmp_path, runscript, where):
    """Without a %runscript, `apptainer run IMAGE train` ran nothing and exited 0, as if
    it had trained (issue 42). The image is the last stage: a runscript in an earlier one
    does not count."""
    first = "Bootstrap: docker\nFrom: golang\nStage: build\n%runscript\n    exec ddl\n\n"
    text = "Bootstrap: docker\nFrom: debian:12\n%post\n    true\n" + runscript
    for definition in (_write(tmp_path, text), _write(tmp_path, first + text)):
        offset = f":{int(where[1:]) + 6}" if where and definition.read_text() != text else where
        proc = run_ddl("container", "check", "--def", str(definition),
                       "--wheelhouse", str(tmp_path))
        assert_one_line_error(proc, f"{definition}{offset}: {'empty' if where else 'no'} "
                              "%runscript: `apptainer run IMAGE train` would run nothing",
                              'exec ddl "$@"')


def test_cli_check_reports_one_line_and_exit_2(tmp_path):
    path = _write(tmp_path, GOOD.replace("%post", "%psot"))
    proc = run_ddl("container", "check", "--def", str(path))
    assert_one_line_error(proc, f"{path}:9: unknown section %psot")


def test_cli_check_names_the_missing_wheelhouse(tmp_path):
    proc = run_ddl("container", "check", "--target", "cpu", cwd=tmp_path)
    assert_one_line_error(proc, "--wheelhouse: no ddl wheel in wheelhouse",
                          "scripts/build-wheelhouse.sh")


def test_runscript_help_labels_and_test_sections_are_in_every_definition():
    """The issue's contract for every image: %runscript runs ddl, %labels carry the build
    metadata, %test and %help exist, and ddl comes from the wheelhouse."""
    for target in ("cpu", "cuda", "rocm"):
        text = (REPO / "containers" / f"{target}.def").read_text()
        stage = parse(REPO / "containers" / f"{target}.def")[0]
        names = {name for _, name, _ in stage.sections}
        assert {"runscript", "labels", "test", "help", "files", "post"} <= names, target
        assert 'exec ddl "$@"' in text
        assert "{{ WHEELHOUSE }} /opt/ddl/wheelhouse" in text
        for label in ("ddl.target", "ddl.commit", "ddl.built", "ddl.base"):
            assert f"    {label} " in text, (target, label)
        assert "ddl.version" in text  # written in %post from the installed ddl


@pytest.mark.parametrize("section", ["post", "setup", "test", "runscript", "environment",
                                     "startscript", "appinstall tool"])
def test_a_shell_syntax_error_in_any_script_section_fails_check(tmp_path, section):
    """`sh -n` on each script section: the line of the error in the file, and where the
    section starts, in one line (exit 2), before a build spends minutes to reach it."""
    text = GOOD + f"\n%{section}\n    set -eu\n    if [ -d /x ]; then\n        echo yes\n"
    definition = _write(tmp_path, text)
    lines = text.splitlines()
    start = len(lines) - lines[::-1].index(f"%{section}")  # the section added last
    proc = run_ddl("container", "check", "--def", str(definition),
                   "--wheelhouse", str(tmp_path))
    assert_one_line_error(proc, f"{definition}:{start + 4}: shell syntax error in "
                          f"%{section.split()[0]} (the section starts at line {start})",
                          "end of file unexpected")


def test_post_with_another_shell_is_parsed_by_that_shell(tmp_path):
    bash_only = "\n%post -c /bin/bash\n    [[ -d /x ]] && echo (\n"
    with pytest.raises(UsageError, match=r"x.def:\d+: shell syntax error in %post .*bash -n"):
        check(_write(tmp_path, GOOD + bash_only))
    fine = "\n%post -c /bin/bash\n    [[ -d /x ]] && echo yes\n    arr=(a b); echo \"${arr[1]}\"\n"
    check(_write(tmp_path, GOOD + fine))  # bash syntax that plain sh -n would reject
