"""The settings table: one declaration per setting, four ways in (flags,
environment, TOML file, defaults), one precedence, precise errors. Pure: no
process, no socket."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sockherd.master import settings as S

pytestmark = pytest.mark.timeout(30)


def flags(*argv: str) -> dict:
    p = argparse.ArgumentParser()
    S.add_arguments(p)
    return vars(p.parse_args(list(argv)))


def test_defaults():
    s = S.resolve({}, env={})
    for st in S.SETTINGS:
        assert getattr(s, st.key) == st.default
    assert s.bind == ["127.0.0.1:8000"] and s.threads == 1


def test_precedence_flag_over_env_over_file(tmp_path: Path):
    cfg = tmp_path / "sockherd.toml"
    cfg.write_text('workers = 2\nthreads = 3\nbacklog = 10\nbind = ["unix:/tmp/x"]\n')
    env = {"SOCKHERD_WORKERS": "5", "SOCKHERD_THREADS": "4"}
    s = S.resolve(flags("-w", "7"), env=env, config=str(cfg))
    assert (s.workers, s.threads, s.backlog, s.bind) == (7, 4, 10, ["unix:/tmp/x"])
    # the file named by the environment
    s = S.resolve({}, env={"SOCKHERD_CONFIG": str(cfg)})
    assert s.workers == 2


def test_lists_from_each_source(tmp_path: Path):
    s = S.resolve(flags("-b", "127.0.0.1:1", "--bind", "unix:/tmp/a"), env={})
    assert s.bind == ["127.0.0.1:1", "unix:/tmp/a"]
    s = S.resolve({}, env={"SOCKHERD_BIND": "127.0.0.1:1,[::1]:2"})
    assert s.bind == ["127.0.0.1:1", "[::1]:2"]


def test_every_setting_has_a_flag_an_env_and_help():
    p = argparse.ArgumentParser()
    S.add_arguments(p)
    text = p.format_help()
    for st in S.SETTINGS:
        assert st.env in text
        assert st.help.split()[0] in text
        assert st.positional or st.flags[-1] in text


@pytest.mark.parametrize("source,value,expect", [
    ("flag", ("-w", "-1"), "command line: -w = '-1': expected `int` >= 0"),
    ("flag", ("--threads", "many"), "command line: --threads = 'many': expected `int`, got `str`"),
    ("flag", ("--interface", "http"), "command line: --interface = 'http': invalid enum value"),
    ("flag", ("bad app",), "command line: MODULE:CALLABLE = 'bad app': expected `str` matching"),
    ("env", {"SOCKHERD_WORKERS": "x"}, "environment: SOCKHERD_WORKERS = 'x': expected `int`"),
    ("env", {"SOCKHERD_BIND": ""}, "environment: SOCKHERD_BIND = []: expected `array` of length >= 1"),
    ("env", {"SOCKHERD_HEARTBEAT_TIMEOUT": "0"}, "SOCKHERD_HEARTBEAT_TIMEOUT = '0': expected `float` >= 0.5"),
    ("env", {"SOCKHERD_UNIX_MODE": "999"}, "SOCKHERD_UNIX_MODE = '999': expected `str` matching"),
])
def test_bad_values_name_source_key_value_and_reason(source, value, expect):
    with pytest.raises(S.SettingsError) as exc:
        if source == "flag":
            S.resolve(flags(*value), env={})
        else:
            S.resolve({}, env=value)
    assert expect in str(exc.value)


def test_bad_file(tmp_path: Path):
    cfg = tmp_path / "s.toml"
    cfg.write_text("workers = '2'\n")          # TOML is typed: a string is not a number
    with pytest.raises(S.SettingsError, match=r"s.toml: workers = '2': expected `int`, got `str`"):
        S.resolve({}, env={}, config=str(cfg))
    cfg.write_text("wrokers = 2\n")
    with pytest.raises(S.SettingsError, match=r"unknown setting 'wrokers'; did you mean 'workers'\? \(known: app, "):
        S.resolve({}, env={}, config=str(cfg))
    cfg.write_text("workers = \n")
    with pytest.raises(S.SettingsError, match=r"s.toml: not valid TOML"):
        S.resolve({}, env={}, config=str(cfg))
    with pytest.raises(S.SettingsError, match=r"cannot read the settings file"):
        S.resolve({}, env={}, config=str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("argv,expect", [
    (("--threads", "2", "--thread-groups", "3"), "more groups than threads"),
    (("--threads", "65",), "65 threads per group, at most 64"),
    (("--heartbeat-interval", "10", "--heartbeat-timeout", "5"), "must exceed heartbeat_interval"),
    (("-b", "127.0.0.1:1", "-b", "localhost:http"), "bind: 'localhost:http': port 'http' is not"),
    # issue 35, point 23: no message bound and deflate, a 255 KiB message inflated to 256 MiB
    (("--ws-max-size", "0", "--ws-per-message-deflate"), r"ws_max_size = 0 \(no limit\) with "
     "ws_per_message_deflate: a compressed message could inflate without bound"),
])
def test_settings_checked_together(argv, expect):
    with pytest.raises(S.SettingsError, match=expect):
        S.resolve(flags(*argv), env={})


def test_readme_table_is_generated_from_the_declarations():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    assert S.docs_markdown() in doc, "docs/settings.md's settings table is stale: " \
        "regenerate it with `python -m sockherd.master.settings`"
