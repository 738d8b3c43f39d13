"""The one table of events: signals, webhook names and the guide agree."""

from pathlib import Path

import pytest

from queuety import signals

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "observability.md").read_text()


@pytest.mark.parametrize("name", list(signals.EVENTS))
def test_every_event__is_a_module_signal_documented_with_its_arguments(name):
    kind = signals.EVENTS[name]
    assert getattr(signals, name) is kind.signal
    assert signals.BY_WEBHOOK[kind.webhook] == name
    row = next(line for line in GUIDE.splitlines() if line.startswith(f"| `{name}` |"))
    for argument in kind.arguments:
        assert f"`{argument}`" in row, f"{name}'s argument {argument} is not documented"
    assert f"`{kind.webhook}`" in GUIDE


def test_a_receiver__makes_its_event_wanted():
    def receiver(sender, **kwargs):
        pass

    signals.run_throttled.connect(receiver)
    try:
        assert signals.wanted("run_throttled")
    finally:
        signals.run_throttled.disconnect(receiver)


def test_an_unknown_event__is_a_key_error():
    with pytest.raises(KeyError):
        signals.emit("run_exploded", run_id=1)
