"""Connects the recording receivers when the app registry is ready."""

import json
import os

from django.apps import AppConfig


def record(name: str):
    def receiver(sender, signal, **arguments):
        from tests.workflows import marks_dir

        line = json.dumps({"signal": name, "sender": sender.__name__, "pid": os.getpid(),
                           **arguments}, default=str)
        with open(marks_dir() / "signals", "a") as handle:
            handle.write(line + "\n")
    return receiver


def broken(sender, **arguments):
    raise RuntimeError("this receiver always raises")


class ObserversConfig(AppConfig):
    name = "tests.observers"
    label = "test_observers"

    def ready(self) -> None:
        from queuety.signals import EVENTS

        self.receivers = []
        for name, kind in EVENTS.items():
            # A raising receiver first: the recording one after it must still be called.
            kind.signal.connect(broken, weak=False, dispatch_uid=f"broken-{name}")
            receiver = record(name)
            kind.signal.connect(receiver, weak=False, dispatch_uid=f"record-{name}")
