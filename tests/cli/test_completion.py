"""`flotilla completion bash|zsh`: the scripts load in their shells and complete commands,
subcommands, flags and flag values from the parser's tree."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import pytest

from flotilla.cli import build_parser
from flotilla.completion import commands
from tests.cli.conftest import ok
from tests.harness.cli import flotilla

PROG = f"{shlex.quote(sys.executable)} -m flotilla"

#: (words typed, the word being completed last) -> what must be offered
CASES = [
    (["flotilla", ""], {"up", "status", "kv", "member", "leader", "snapshot", "completion"}),
    (["flotilla", "--v"], {"--version"}),
    (["flotilla", "kv", ""], {"put", "get", "del", "ls"}),
    (["flotilla", "kv", "ls", "--"], {"--output", "--dir", "--endpoints", "--token",
                                      "--timeout", "--limit"}),
    (["flotilla", "status", "-o", ""], {"table", "json", "yaml"}),
    (["flotilla", "member", "--dir", "d", ""], {"list", "add", "remove"}),
    (["flotilla", "member", "add", "n4", "--"], {"--peer-url", "--client-url"}),
    (["flotilla", "leader", ""], {"move"}),
    (["flotilla", "completion", ""], {"bash", "zsh"}),
    (["flotilla", "node", "--data"], {"--data-dir"}),
    (["flotilla", "up", "--restore-"], {"--restore-from", "--restore-index", "--restore-time"}),
    (["flotilla", "node", "--restore-t"], {"--restore-time"}),
]


def test_the_tree_has_every_command_of_the_parser():
    paths = {" ".join(c.path) for c in commands(build_parser())}
    assert {"", "up", "status", "down", "scale", "kv put", "kv ls", "member list",
            "member add", "member remove", "leader move", "snapshot", "completion",
            "node", "operator"} <= paths


def test_bash_loads_and_completes():
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    load = f"source <({PROG} completion bash)"
    out = subprocess.run(["bash", "-c", f"{load} && complete -p flotilla"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "complete -F _flotilla flotilla"
    for words, expected in CASES:
        array = " ".join(shlex.quote(w) for w in words)
        script = (f"{load}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _flotilla; "
                  'printf "%s\\n" "${COMPREPLY[@]}"')
        got = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             check=True).stdout.split()
        assert expected <= set(got), (words, got)


def test_zsh_parses_and_completes(tmp_path):
    if shutil.which("zsh") is None:
        pytest.skip("no zsh here (apt-get install zsh): the script is only generated")
    path = tmp_path / "_flotilla"
    path.write_text(ok(flotilla("completion", "zsh")))
    subprocess.run(["zsh", "-n", str(path)], check=True)
    # Outside a completion widget the builtins it calls are stand-ins that print their words.
    stubs = ('compdef() { :; }; compadd() { shift; print -l -- "$@"; }; '
             '_describe() { local -a items; items=("${(@P)4}"); print -l -- "${items[@]%%:*}"; };'
             ' _files() { print -- FILES "$@"; }; _message() { :; }; '
             f"source {shlex.quote(str(path))}")
    for words, expected in CASES:
        array = " ".join(shlex.quote(w) for w in words)
        script = (f"{stubs}; words=({array}); CURRENT={len(words)}; "
                  f"PREFIX={shlex.quote(words[-1])}; _flotilla")
        got = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True,
                             check=True).stdout.split()
        assert expected <= set(got), (words, got)


def test_a_directory_flag_completes_directories():
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    script = (f"source <({PROG} completion bash); cd / && COMP_WORDS=(flotilla up --dir e); "
              'COMP_CWORD=3; _flotilla; printf "%s\\n" "${COMPREPLY[@]}"')
    got = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    assert "etc" in got
