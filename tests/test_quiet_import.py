"""ddptui.rank.quiet_import: torch's import with the collector paused, what it loaded frozen."""

import gc
import sys

import pytest

from ddptui.rank.quiet_import import import_quietly


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_the_import_runs_with_the_collector_paused_and_what_it_loaded_is_frozen(module_dir):
    name = module_dir(
        "qi_probe", "import gc\nENABLED = gc.isenabled()\nHELD = [[] for _ in range(50)]\n"
    )
    before = gc.get_freeze_count()
    module = import_quietly(name)
    assert module is sys.modules[name]
    assert module.ENABLED is False  # paused while the module ran
    assert gc.isenabled()  # and on again after
    assert gc.get_freeze_count() >= before + 50
    assert not any(obj is module.HELD for obj in gc.get_objects())  # out of the collector's view


def test_a_collector_switched_off_stays_off(module_dir):
    name = module_dir("qi_off", "X = 1\n")
    gc.disable()
    try:
        assert import_quietly(name).X == 1
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failed_import_raises_freezes_nothing_and_turns_the_collector_back_on(
    module_dir, monkeypatch
):
    # What the module made outlives it (held by ``sys.qi_held``), as a partly run import's
    # side effects may. The freeze count alone cannot say "nothing frozen": a frozen object
    # that dies leaves it (2 fewer once under .ci/run), and a wrongful freeze would add every
    # object the worker tracks, thousands.
    monkeypatch.setattr(sys, "qi_held", None, raising=False)
    body = "import sys\nsys.qi_held = HELD = [[] for _ in range(50)]\nraise ImportError('no')\n"
    name = module_dir("qi_broken", body)
    before = gc.get_freeze_count()
    with pytest.raises(ImportError, match="no"):
        import_quietly(name)
    assert gc.isenabled()
    assert gc.get_freeze_count() <= before
    held = sys.qi_held
    assert any(obj is held for obj in gc.get_objects())  # still in the collector's view


def test_a_module_already_loaded_is_returned_without_freezing(module_dir):
    name = module_dir("qi_loaded", "X = 2\n")
    __import__(name)
    before = gc.get_freeze_count()
    assert import_quietly(name) is sys.modules[name]
    assert gc.get_freeze_count() <= before  # (a frozen object may die meanwhile)
