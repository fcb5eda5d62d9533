"""Controller settings from the environment (``PLACECTL_<NAME>``) and ``--set``: every
setting reachable, one naming scheme, bad values refused with the variable, what it
takes and the default named."""

from __future__ import annotations

import msgspec
import pytest

from controller import SettingsError
from controller.runtime.controller import PlacementController
from controller.runtime.core.settings import Settings, by_name, from_environ, variable
from tests.unit.fakes import cluster, run


def test_every_setting_has_its_variable_and_takes_it():
    for field in msgspec.structs.fields(Settings):
        default = field.default
        raw = "1" if isinstance(default, bool) else str(default * 2 or 1)
        got = getattr(from_environ({variable(field.name): raw}), field.name)
        assert got == (True if isinstance(default, bool) else type(default)(raw)), field.name
    assert from_environ({}) == Settings()
    assert variable("suspect_after") == "PLACECTL_SUSPECT_AFTER"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"PLACECTL_SUSPECT_AFTER": "soon"},
            "PLACECTL_SUSPECT_AFTER='soon': expected a number of seconds > 0; default 2",
        ),
        ({"PLACECTL_SUSPECT_AFTER": "0"}, "expected a number of seconds > 0"),
        ({"PLACECTL_SUSPECT_AFTER": "inf"}, "expected a number of seconds > 0"),
        ({"PLACECTL_FENCE_GRACE": "-1"}, "expected a number of seconds >= 0; default 0"),
        ({"PLACECTL_FENCE_AFTER": "3"}, "PLACECTL_FENCE_AFTER is no longer read: it is now "),
        ({"PLACECTL_EVENTS_KEPT": "0"}, "PLACECTL_EVENTS_KEPT='0': expected a whole number >= 1"),
        ({"PLACECTL_EVENTS_KEPT": "2.5"}, "expected a whole number >= 1; default 1000"),
        ({"PLACECTL_REFUSED_CONFIRM": "-1"}, "expected a number of seconds >= 0"),
        ({"PLACECTL_TEST_HOOKS": "maybe"}, "expected 1 or 0 (true or false); default 0"),
        (
            {"PLACECTL_QUORUM_SAMPLE": "2"},
            "PLACECTL_QUORUM_SAMPLE='2': expected a whole number >= 3",
        ),
        (
            {"PLACECTL_FENCE_GRACE": "120", "PLACECTL_HOLD_DOWN_WINDOW": "60"},
            "PLACECTL_HOLD_DOWN_WINDOW=60: expected at least 120 s (fence_grace 120 s, "
            "hold_down_after 3 x suspect_after 2 s), or PLACECTL_HOLD_DOWN_AFTER=0",
        ),
        ({"PLACECTL_HOLD_DOWN_WINDOW": "5"}, "expected at least 6 s"),
    ],
)
def test_bad_values_name_the_variable_what_it_takes_and_the_default(env, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_environ(env)


def test_zero_is_taken_where_zero_means_none():
    assert from_environ({"PLACECTL_WARM_BUDGET": "0"}).warm_budget == 0
    assert from_environ({"PLACECTL_REFUSED_CONFIRM": "0"}).refused_confirm == 0.0
    assert from_environ({"PLACECTL_FENCE_GRACE": "0"}).fence_grace == 0.0  # Ray's own


def test_set_by_name_checks_names_and_values_before_anything_starts():
    assert by_name({"suspect_after": "3"}) == {"PLACECTL_SUSPECT_AFTER": "3"}
    with pytest.raises(SettingsError, match="unknown setting 'suspect_aftr'; the settings are: "):
        by_name({"suspect_aftr": "3"})
    with pytest.raises(SettingsError, match="setting 'fence_after' was renamed: it is now sus"):
        by_name({"fence_after": "3"})
    with pytest.raises(SettingsError, match="PLACECTL_DRAIN_GRACE='-5'"):
        by_name({"drain_grace": "-5"})


def test_a_controller_takes_its_settings_from_its_environment(monkeypatch):
    monkeypatch.setenv("PLACECTL_SUSPECT_AFTER", "3.5")
    monkeypatch.setenv("PLACECTL_EVENTS_KEPT", "50")

    async def go():
        ctl = PlacementController(io=cluster())
        try:
            return ctl.settings
        finally:
            await ctl.stop()

    settings = run(go())
    assert (settings.suspect_after, settings.events_kept) == (3.5, 50)
    assert settings.drain_grace == Settings().drain_grace
