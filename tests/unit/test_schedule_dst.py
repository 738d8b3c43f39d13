"""Schedules across daylight saving time: the tick a fire is keyed by, over a simulated clock
that steps one minute at a time through each transition day. Pure logic, no database."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from queuety import schedules

UTC = timezone.utc


def minutes(start: datetime, hours: int) -> list[datetime]:
    """Every minute (plus 20 s, as a beat fire lands a little after its tick) from ``start``."""
    return [start + timedelta(minutes=step, seconds=20) for step in range(hours * 60)]


def fired_ticks(expression: str, zone: str, start: datetime, hours: int) -> list[datetime]:
    """The ticks a sender that fired every minute would key its fires by, each time the tick
    changes: what starts a run, as every other fire finds its tick's key taken."""
    cron, tz = schedules.parse_cron(expression), ZoneInfo(zone)
    ticks: list[datetime] = []
    for now in minutes(start, hours):
        tick = schedules.latest_tick(cron, now, tz)
        assert tick <= now, f"the tick {tick} of {now} is still to come"
        assert not ticks or tick >= ticks[-1], f"the tick went back to {tick} at {now}"
        if not ticks or tick != ticks[-1]:
            ticks.append(tick)
    return ticks


# The day before, the transition day and the day after, from 22:00 local two days before.
@pytest.mark.parametrize(("expression", "zone", "start", "expected"), [
    # Berlin springs forward on 29 March 2026 at 02:00 CET (01:00 UTC) to 03:00 CEST: the
    # skipped 02:30 is the first instant after the jump, 03:00 CEST (01:00 UTC).
    ("30 2 * * *", "Europe/Berlin", datetime(2026, 3, 27, 21, 0, tzinfo=UTC),
     ["2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30"]),
    # Berlin falls back on 25 October 2026 at 03:00 CEST (01:00 UTC) to 02:00 CET: 02:30
    # happens at 00:30 and at 01:30 UTC; the tick is the first.
    ("30 2 * * *", "Europe/Berlin", datetime(2026, 10, 23, 20, 0, tzinfo=UTC),
     ["2026-10-24T00:30", "2026-10-25T00:30", "2026-10-26T01:30"]),
    # New York springs forward on 8 March 2026 at 02:00 EST (07:00 UTC) to 03:00 EDT: the
    # skipped 02:30 is 03:00 EDT (07:00 UTC).
    ("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 3, 0, tzinfo=UTC),
     ["2026-03-07T07:30", "2026-03-08T07:00", "2026-03-09T06:30"]),
    # New York falls back on 1 November 2026 at 02:00 EDT (06:00 UTC) to 01:00 EST: 01:30
    # happens at 05:30 and 06:30 UTC.
    ("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 2, 0, tzinfo=UTC),
     ["2026-10-31T05:30", "2026-11-01T05:30", "2026-11-02T06:30"]),
])
def test_latest_tick__a_daily_schedule_fires_once_each_day_across_a_transition(
        expression, zone, start, expected):
    ticks = fired_ticks(expression, zone, start, hours=3 * 24)
    assert [tick.strftime("%Y-%m-%dT%H:%M") for tick in ticks[1:]] == expected
    # One run a local day, and on ordinary days at the wall-clock time asked for.
    days = Counter(tick.astimezone(ZoneInfo(zone)).date() for tick in ticks[1:])
    assert set(days.values()) == {1}
    hour, minute = int(expression.split()[1]), int(expression.split()[0])
    assert (ticks[1].astimezone(ZoneInfo(zone)).hour, ticks[3].astimezone(
        ZoneInfo(zone)).hour) == (hour, hour)
    assert ticks[1].minute == ticks[3].minute == minute


@pytest.mark.parametrize(("zone", "day"), [
    ("Europe/Berlin", datetime(2026, 3, 29)), ("Europe/Berlin", datetime(2026, 10, 25)),
    ("America/New_York", datetime(2026, 3, 8)), ("America/New_York", datetime(2026, 11, 1)),
])
def test_latest_tick__each_wall_clock_tick_of_a_frequent_schedule_fires_once(zone, day):
    tz = ZoneInfo(zone)
    start = day.replace(tzinfo=tz).astimezone(UTC)
    ticks = fired_ticks("*/30 * * * *", zone, start, hours=25)
    labels = Counter(tick.astimezone(tz).strftime("%H:%M") for tick in ticks
                     if tick.astimezone(tz).date() == day.date())
    assert set(labels.values()) == {1}, labels  # a repeated wall-clock time is one tick
    existing = {moment.astimezone(tz).strftime("%H:%M") for moment in
                (start + timedelta(minutes=30 * step) for step in range(50))
                if moment.astimezone(tz).date() == day.date()}
    assert set(labels) == existing  # and no wall-clock time the day has is left out


@pytest.mark.parametrize(("wall", "zone", "instant"), [
    (datetime(2026, 3, 29, 2, 30), "Europe/Berlin", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    (datetime(2026, 3, 29, 2, 0), "Europe/Berlin", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    (datetime(2026, 3, 29, 3, 0), "Europe/Berlin", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    (datetime(2026, 10, 25, 2, 30), "Europe/Berlin",
     datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
    (datetime(2026, 10, 25, 2, 30, fold=1), "Europe/Berlin",
     datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
    (datetime(2026, 3, 8, 2, 59), "America/New_York", datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),
    # Lord Howe Island jumps by half an hour, at 02:00 local.
    (datetime(2026, 10, 4, 2, 10), "Australia/Lord_Howe",
     datetime(2026, 10, 3, 15, 30, tzinfo=UTC)),
    (datetime(2026, 7, 1, 12, 0), "Europe/Berlin", datetime(2026, 7, 1, 10, 0, tzinfo=UTC)),
])
def test_first_instant__a_skipped_time_is_the_jump_a_repeated_one_its_first_occurrence(
        wall, zone, instant):
    assert schedules.first_instant(wall.replace(tzinfo=ZoneInfo(zone))) == instant


@pytest.mark.parametrize("every", [90, 900, 3600, 7200])
@pytest.mark.parametrize("around", [
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC), datetime(2026, 10, 25, 1, 0, tzinfo=UTC),
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC), datetime(2026, 11, 1, 6, 0, tzinfo=UTC),
])
def test_interval_slot__keeps_its_utc_cadence_across_a_transition(every, around):
    slots: list[datetime] = []
    for now in minutes(around - timedelta(hours=6), hours=12):
        slot = schedules.interval_slot(every, now)
        if not slots or slot != slots[-1]:
            slots.append(slot)
    gaps = {(later - earlier).total_seconds() for earlier, later in zip(slots, slots[1:])}
    assert gaps == {every}  # not shifted by an hour, no double, no gap
    assert len(slots) >= 12 * 3600 // every
