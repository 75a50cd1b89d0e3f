"""Record scripted agent sessions against the booking server as a JSONL call log.

Stands in for the log of a real agent using your own server, like `examples/inventory_traffic.py`: each
episode is a user's request and the 2-7 calls an agent made for it, a careful agent reading before it
writes, a careless one (30 % of episodes) making the mistakes agents make (booking without reading first, a typo in a room or booking id, a room too
small for the meeting, a 20-minute slot, an hour that has passed, a weekend, cancelling twice, moving a
meeting that took place). A careful agent fails too, where no reply could warn it: a colleague took the
slot it just saw free, or the organizer reached the daily limit. Every result is what the server returned
(`content`, `structuredContent`, `isError`). One line per episode, the shape `envace traces import` reads:

    {"id": "s0-ep0000", "task": "...", "calls": [{"tool": "list_rooms", "arguments": {...}, "result": {...}}, ...]}

Episodes are independent and replayable: episode k of `--seed s` runs against a fresh building of seed
`world_seed(s, k)` (in-process by default; with `--servers examples/booking.json` a new server process per
episode, with `BOOKING_SEED` set). The user's request is written from that building's initial state: the
user knows today's date and their own bookings' ids.

    python examples/booking_traffic.py --episodes 300 --seed 0 --out booking_log.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from envace_mcp import Toolbox
from envace_mcp.toolbox import load_servers

sys.path.insert(0, str(Path(__file__).parent))
from booking_server import (  # noqa: E402
    MAX_HOURS, PEOPLE, POPULAR, TITLES, Booking, RoomDetail, build_server, business_days, hhmm, initial_state, minutes)

CARELESS = 0.3
"""Chance that the agent skips the checks it should make before a write; with this building's schedules it
makes about 30 % of writes fail, the share `examples/inventory_traffic.py` aims at too."""
WRITES = {"book_room", "move_booking", "cancel_booking"}
Building = tuple[dt.datetime, dict[str, RoomDetail], dict[str, Booking]]


def world_seed(seed: int, episode: int) -> int:
    """The building seed of one episode: a new world each episode, so no answer can be memorised."""
    return seed * 1_000_000 + episode


class Session:
    """One episode's calls, recorded as the server answered them."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, tool: str, **arguments: Any) -> dict[str, Any] | None:
        """The call's structured content, or `None` when the server answered with an error."""
        arguments = {key: value for key, value in arguments.items() if value is not None}
        result = await self.toolbox.call(tool, arguments)
        if result.error_kind not in (None, "tool_error"):  # made by the toolbox, not an answer of the server
            raise RuntimeError(f"{tool}{arguments}: {result.error_kind}: {result.text}")
        answer: dict[str, Any] = {"content": result.content, "isError": result.is_error}
        if result.structured_content is not None:
            answer["structuredContent"] = result.structured_content
        self.calls.append({"tool": tool, "arguments": arguments, "result": answer})
        return None if result.is_error else result.structured_content


def typo(ident: str, rng: random.Random) -> str:
    head, digits = ident.split("-")
    swapped = digits[:-2] + digits[-1] + digits[-2]
    return f"{head}-{swapped}" if swapped != digits and rng.random() < 0.6 else f"{head}-{digits[:-1]}"


def when(day: dt.date) -> str:
    return f"{day:%a} {day}"


def lasting(length: int) -> str:
    return "an hour" if length == 60 else f"{length // 60} hours" if length % 60 == 0 else f"{length} minutes"


def upcoming_days(now: dt.datetime) -> list[dt.date]:
    """Today and the next three working days: the days the building has bookings for."""
    return business_days(now.date(), now.date() + dt.timedelta(days=7))[:4]


def pick_day(now: dt.datetime, rng: random.Random) -> dt.date:
    draw, days = rng.random(), upcoming_days(now)
    if draw < 0.05:
        return now.date() + dt.timedelta(days=5 - now.weekday())
    return days[0] if draw < 0.3 else rng.choice(days[1:])


def pick_start(rng: random.Random) -> str:
    odd = {"08:00": 1, "12:30": 1, "17:00": 1, "17:30": 1}
    return rng.choices([*POPULAR, *odd], weights=[*POPULAR.values(), *odd.values()])[0]


def pick_length(rng: random.Random) -> int:
    return rng.choices([30, 45, 60, 90, 120, 20, 50, 300], weights=[3, 2, 7, 2, 2, 1, 1, 1])[0]


def fits(room: dict[str, Any], start: str, end: str) -> bool:
    return minutes(room["opens"]) <= minutes(start) and minutes(end) <= minutes(room["closes"])


def free(schedule: dict[str, Any], start: str, end: str) -> bool:
    """Whether a schedule the agent read shows the slot open, as far as it can tell."""
    as_of = dt.datetime.fromisoformat(schedule["as_of"])
    return (schedule["closed"] is None and dt.datetime.fromisoformat(f"{schedule['date']} {start}") > as_of
            and fits(schedule, start, end)
            and not any(minutes(start) < minutes(b["end"]) and minutes(b["start"]) < minutes(end)
                        for b in schedule["bookings"]))


def pick_booking(building: Building, rng: random.Random) -> Booking:
    """One of the user's bookings: mostly upcoming ones, now and then one they forgot took place or was cancelled."""
    _, _, bookings = building
    weights = {"upcoming": 8, "in_progress": 1, "finished": 2, "cancelled": 1}
    present = [s for s in weights if any(b.status == s for b in bookings.values())]
    status = rng.choices(present, weights=[weights[s] for s in present])[0]
    return rng.choice([b for b in bookings.values() if b.status == status])


async def book_meeting(call: Session, rng: random.Random, building: Building, careless: bool) -> str:
    now, rooms, _ = building
    people = rng.choices([2, 3, 4, 5, 6, 8, 10, 12, 16, 20], weights=[4, 4, 4, 3, 3, 2, 2, 1, 1, 1])[0]
    organizer, title = rng.choice(PEOPLE), rng.choice(TITLES)
    day, start, length = pick_day(now, rng), pick_start(rng), pick_length(rng)
    wish, floor = rng.choices(["room", "floor", "any"], weights=[4, 2, 4])[0], rng.choice([1, 2, 3])
    big_enough = [r for r in sorted(rooms) if rooms[r].seats >= people]
    named = rng.choice(big_enough if rng.random() < 0.75 else sorted(rooms))  # users misjudge a room's size
    where = {"room": f" {rooms[named].name} ({named})", "floor": f" a room on floor {floor}", "any": " a room"}[wish]
    task = (f"Book{where} for {organizer}'s {title.lower()} on {when(day)} at {start}, {lasting(length)}, "
            f"{people} people.")
    if not careless:
        length = min(-(-length // 15) * 15, MAX_HOURS * 60)  # a 20-minute meeting takes a half-hour slot
    end = hhmm(minutes(start) + length)
    if wish == "room" and careless:
        listing = {"rooms": [await call("get_room", room_id=named)]} if rng.random() < 0.5 else None
        if listing is None:
            await call("list_bookings", room_id=named, date=str(day))  # read, and not compared with the request
    elif wish == "room":
        listing = await call("list_rooms", min_seats=people)
    else:
        listing = await call("list_rooms", floor=floor if wish == "floor" else None,
                             min_seats=people if wish == "any" and not careless else None)
    rooms_seen = listing["rooms"] if listing else []
    if careless:
        choice = named if wish == "room" else rng.choice(rooms_seen)["id"]
        if wish != "room" and rng.random() < 0.4:
            await call("list_bookings", room_id=choice, date=str(day))  # read, and not compared with the request
        if minutes(end) >= 13 * 60 and rng.random() < 0.15:
            end = hhmm(minutes(end) - 12 * 60)  # the end on a 12-hour clock: 14:00-03:00 for 14:00-15:00
        if rng.random() < 0.2:
            await call("book_room", room_id=typo(choice, rng), date=str(day), start=start, end=end, title=title,
                       organizer=organizer, attendees=people)
        booked = await call("book_room", room_id=choice, date=str(day), start=start, end=end, title=title,
                            organizer=organizer, attendees=people)
        others = [r["id"] for r in rooms_seen if r["id"] != choice and r["seats"] >= people]
        if booked is None and others and rng.random() < 0.5:  # tries another room, unchecked
            booked = await call("book_room", room_id=rng.choice(others), date=str(day), start=start, end=end,
                                title=title, organizer=organizer, attendees=people)
    else:
        candidates = sorted((r for r in rooms_seen if r["seats"] >= people and fits(r, start, end)),
                            key=lambda r: (r["id"] != named, r["seats"]))
        booked = None
        if not candidates:  # to tell the user why no room will do
            await call("get_room", room_id=named if wish == "room" else rooms_seen[0]["id"])
        for room in candidates[:2]:
            schedule = await call("list_bookings", room_id=room["id"], date=str(day))
            if schedule["closed"] == "weekend" or not free({**schedule, "closed": None, "bookings": []}, start, start):
                break  # the user has to pick another day or hour
            if free(schedule, start, end):
                booked = await call("book_room", room_id=room["id"], date=str(day), start=start, end=end, title=title,
                                    organizer=organizer, attendees=people)
                break
    if booked and rng.random() < 0.25:
        await call("get_booking", booking_id=booked["id"])
    return task


async def interviews(call: Session, rng: random.Random, building: Building, careless: bool) -> str:
    now, rooms, _ = building
    organizer, day = rng.choice(PEOPLE), rng.choice(upcoming_days(now)[1:])
    rid = rng.choice(["R-101", "R-201", "R-301", "R-102"])
    hours = sorted(rng.sample(["09:00", "10:00", "11:00", "13:00", "14:00", "15:00", "16:00"], rng.choice([2, 3])))
    task = (f"{organizer} interviews candidates on {when(day)} at {', '.join(hours)}, an hour each with 3 people "
            f"in the room: book {rooms[rid].name} ({rid}) for them.")
    if not careless:
        room = await call("get_room", room_id=rid)
        if room["seats"] < 3 or day in [dt.date.fromisoformat(d) for d in room["maintenance"]]:
            listing = await call("list_rooms", floor=room["floor"], min_seats=3)
            if not listing["rooms"]:
                return task
            rid = listing["rooms"][0]["id"]
        schedule = await call("list_bookings", room_id=rid, date=str(day))
        hours = [h for h in hours if free(schedule, h, hhmm(minutes(h) + 60))]
    for hour in hours:
        booked = await call("book_room", room_id=rid, date=str(day), start=hour, end=hhmm(minutes(hour) + 60),
                            title="Interview", organizer=organizer, attendees=3)
        if booked is None and not careless:
            break
    return task


async def move_meeting(call: Session, rng: random.Random, building: Building, careless: bool) -> str:
    now, rooms, _ = building
    meeting = pick_booking(building, rng)
    bid, kind = meeting.id, rng.choices(["later", "day", "room", "extend"], weights=[3, 2, 2, 3])[0]
    if meeting.status == "in_progress":
        kind = "extend"
    room_id, day, start, end = meeting.room_id, meeting.date, None, None
    if kind == "later":
        start = hhmm(minutes(meeting.start) + rng.choice([30, 60, 60, 120]))
        ask = f"push it to {start}"
    elif kind == "day":
        day = rng.choice([d for d in upcoming_days(now) if d != meeting.date] or [meeting.date])
        ask = f"move it to {when(day)}, same time"
    elif kind == "room":
        room_id = rng.choice([r for r in sorted(rooms) if r != meeting.room_id])
        ask = f"move it to {rooms[room_id].name} ({room_id})"
    else:
        end = hhmm(minutes(meeting.end) + rng.choice([15, 30, 30, 60]))
        ask = f"it needs to run until {end}"
    task = f"My {meeting.title.lower()} {bid} in {meeting.room_name} on {when(meeting.date)}: {ask}."
    seen = await call("get_booking", booking_id=bid) if not careless or rng.random() < 0.5 else None
    if careless and seen is None:
        await call("list_bookings", room_id=room_id, date=str(day))  # read, and not compared with the request
    if not careless:
        if seen["status"] in ("cancelled", "finished") or (seen["status"] == "in_progress" and kind != "extend"):
            await call("list_bookings", room_id=meeting.room_id, date=str(meeting.date))  # to show the user
            return task
        if kind == "room":
            target = await call("get_room", room_id=room_id)
            if target["seats"] < meeting.attendees:
                return task
        new_start = start or meeting.start
        new_end = end or hhmm(minutes(new_start) + minutes(meeting.end) - minutes(meeting.start))
        schedule = await call("list_bookings", room_id=room_id, date=str(day))
        others = {**schedule, "bookings": [b for b in schedule["bookings"] if b["id"] != bid]}
        if not free(others, meeting.end if meeting.status == "in_progress" else new_start, new_end):
            return task
    elif rng.random() < 0.15:
        await call("move_booking", booking_id=typo(bid, rng), room_id=None if room_id == meeting.room_id else room_id,
                   date=None if day == meeting.date else str(day), start=start, end=end)
    moved = await call("move_booking", booking_id=bid, room_id=None if room_id == meeting.room_id else room_id,
                       date=None if day == meeting.date else str(day), start=start, end=end)
    if moved and rng.random() < 0.3:
        await call("list_bookings", room_id=moved["room_id"], date=moved["date"])
    return task


async def cancel_meetings(call: Session, rng: random.Random, building: Building, careless: bool) -> str:
    first = pick_booking(building, rng)
    second = pick_booking(building, rng) if rng.random() < 0.4 else None
    ids = [first.id] + ([second.id] if second and second.id != first.id else [])
    task = f"Cancel {' and '.join(ids)}, {first.organizer} won't need {'them' if len(ids) > 1 else 'it'}."
    for bid in ids:
        seen = await call("get_booking", booking_id=bid) if not careless or rng.random() < 0.4 else None
        if careless or seen["status"] == "upcoming":
            cancelled = await call("cancel_booking", booking_id=typo(bid, rng) if careless and rng.random() < 0.15
                                   else bid)
            if careless and cancelled and rng.random() < 0.35:  # loses track: cancels again to be sure
                await call("cancel_booking", booking_id=bid)
    if len(call.calls) < 2:
        await call("list_bookings", room_id=first.room_id, date=str(first.date))
    return task


async def change_of_plans(call: Session, rng: random.Random, building: Building, careless: bool) -> str:
    now, rooms, _ = building
    organizer, title, people = rng.choice(PEOPLE), rng.choice(TITLES), rng.randint(2, 4)
    rid = rng.choice([r for r in sorted(rooms) if rooms[r].seats >= people])
    day, start = rng.choice(upcoming_days(now)[1:]), rng.choice(list(POPULAR))
    end, then = hhmm(minutes(start) + 60), rng.choice(["cancel", "extend"])
    later = hhmm(minutes(end) + rng.choice([30, 60]))
    task = (f"Book {rooms[rid].name} ({rid}) on {when(day)} {start}-{end} for {organizer}'s {title.lower()}, "
            f"{people} people. " + ("Actually, cancel that, it's off." if then == "cancel" else
                                    f"Oh, and it should run until {later}."))
    schedule = await call("list_bookings", room_id=rid, date=str(day))
    if not careless and not free(schedule, start, later if then == "extend" else end):
        await call("list_rooms", min_seats=people)  # to offer the user another room
        return task
    booked = await call("book_room", room_id=rid, date=str(day), start=start, end=end, title=title,
                        organizer=organizer, attendees=people)
    if booked is None:
        return task
    if then == "cancel":
        await call("cancel_booking", booking_id=booked["id"])
        if careless:  # loses track of what it did: cancels again, or moves the cancelled booking
            again = rng.choice(["cancel_booking", "move_booking"])
            await call(again, booking_id=booked["id"], **({"end": later} if again == "move_booking" else {}))
    else:
        await call("move_booking", booking_id=booked["id"], end=later)
    return task


SCENARIOS = [(book_meeting, 6), (interviews, 2), (move_meeting, 3), (cancel_meetings, 2), (change_of_plans, 2)]


async def play(toolbox: Toolbox, rng: random.Random, building: Building,
               careless: float = CARELESS) -> tuple[str, list[dict[str, Any]]]:
    """One episode on a fresh server: the user's task and the calls made for it."""
    scenario = rng.choices([s for s, _ in SCENARIOS], weights=[w for _, w in SCENARIOS])[0]
    call = Session(toolbox)
    task = await scenario(call, rng, building, rng.random() < careless)
    return task, call.calls


async def record(episodes: int, seed: int, servers: str | Mapping[str, Any] | None = None,
                 careless: float = CARELESS) -> list[dict[str, Any]]:
    """`episodes` log lines; with `servers` (an mcpServers config with one stdio entry), each episode
    launches that server with `BOOKING_SEED` set to its building."""
    stdio = [*load_servers(servers).items()][0] if servers else None
    rng, lines = random.Random(seed), []
    for k in range(episodes):
        world = world_seed(seed, k)
        if stdio:
            name, spec = stdio
            target = {name: spec.model_copy(update={"env": {**(spec.env or {}), "BOOKING_SEED": str(world)}})}
        else:
            target = {"booking": build_server(world)}
        async with Toolbox(target) as toolbox:
            task, calls = await play(toolbox, rng, initial_state(world), careless)
        lines.append({"id": f"s{seed}-ep{k:04d}", "task": task, "calls": calls})
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("booking_log.jsonl"))
    parser.add_argument("--servers", help="an mcpServers config with one stdio entry (default: the server in-process)")
    parser.add_argument("--careless", type=float, default=CARELESS, help="chance an episode's agent skips its checks")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    lines = anyio.run(record, args.episodes, args.seed, args.servers, args.careless)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    writes = [c for line in lines for c in line["calls"] if c["tool"] in WRITES]
    failed = sum(c["result"]["isError"] for c in writes)
    calls = sum(len(line["calls"]) for line in lines)
    print(f"{len(lines)} episodes, {calls} calls, {failed}/{len(writes)} writes failed "
          f"({failed / max(len(writes), 1):.0%}) -> {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
