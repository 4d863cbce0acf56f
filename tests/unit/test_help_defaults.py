"""What `--help` says a default is, against the default the code applies (issue 42:
`ddl train --help` said the site default was `local`; it is `auto`)."""

import pytest

from ddl.commands.parser import make_parser
from ddl.settings.config import RunConfig

pytestmark = pytest.mark.unit


def _help(command: str, flag: str) -> str:
    parser = make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    return action.help


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_site_help_names_the_real_default(command):
    default = RunConfig.model_fields["site"].default
    assert default == "auto"
    text = _help(command, "--site")
    assert f"default: {default}" in text and "default: local" not in text, text
