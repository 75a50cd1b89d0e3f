"""A meeting-room booking MCP server: rooms, their schedules, booking, moving and cancelling meetings.

Written like `examples/inventory_server.py`, the way you would write your own server with the MCP Python
SDK (no envace-mcp imports): typed tools whose return types become `outputSchema` (so replies carry
`structuredContent`), annotations on every tool, and business failures raised as `ToolError`. Its failures
depend on the arguments and on the building's state. Most can be seen coming by an agent that reads first:
an unknown room or booking, a slot that overlaps another booking, more attendees than seats, a room
closed for maintenance or on a weekend, a slot outside opening hours, off the quarter hour, too long or
already started, cancelling a booking twice or moving one that took place. Two cannot: a colleague may
book a slot of a schedule just after it was read (a popular hour, now and then), and each organizer may
hold only a few bookings a day, a limit no reply shows until it is hit.

The state lives in the process and is built from a seed: the building's clock (frozen at a weekday
moment of one week), which rooms are closed for maintenance when, and the week's bookings; a fresh process
(or `build_server(seed)` in-process) is a fresh, reproducible building. envace-mcp never trained on this
server: it is the held-out server of `examples/booking_traffic.py`.

    python examples/booking_server.py                       # stdio; seed from BOOKING_SEED, else 0
    python examples/booking_server.py --seed 7 --transport http --port 8011
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

Floor = Literal[1, 2, 3]
Status = Literal["upcoming", "in_progress", "finished", "cancelled"]
ROOMS: dict[str, tuple[str, Floor, int, str, str, tuple[str, ...]]] = {
    # id: (name, floor, seats, opens, closes, equipment)
    "R-101": ("Atlas", 1, 4, "08:00", "18:00", ("screen",)),
    "R-102": ("Borealis", 1, 10, "08:00", "18:00", ("screen", "video")),
    "R-201": ("Cedar", 2, 6, "08:00", "19:00", ("whiteboard",)),
    "R-202": ("Delta", 2, 16, "07:30", "20:00", ("screen", "video", "whiteboard")),
    "R-301": ("Ember", 3, 2, "08:00", "18:00", ("phone",)),
    "R-302": ("Fjord", 3, 30, "09:00", "17:00", ("projector", "video", "microphones")),
}
PEOPLE = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]
TITLES = ["Team sync", "1:1", "Design review", "Interview", "Sprint planning", "Customer call", "Budget review",
          "Retro", "Hiring debrief", "Roadmap workshop"]
WEEK = dt.date(2025, 3, 10)
"""The Monday of the week every building lives in; its clock stops on a weekday of it, Monday to Thursday."""
DAILY_LIMIT = 3
"""Bookings one organizer may hold on a day. `book_room` says there is a limit; no reply says how many."""
MAX_HOURS = 4
POPULAR: dict[str, int] = {"10:00": 4, "14:00": 4, "09:00": 2, "11:00": 2, "13:00": 2, "15:00": 2, "16:00": 1}
"""Start times people ask for, and how much more than others: the colleagues' and the traffic's."""
COLLEAGUES = 0.35
"""Chance that a colleague books a free popular hour of a schedule just read, before the next call."""

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
# moving to where it already is, or cancelling a cancelled booking, changes nothing: idempotent in the spec's sense
CHANGE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


class Room(BaseModel):
    id: str
    name: str
    floor: Floor
    seats: int
    opens: str
    closes: str


class RoomDetail(Room):
    equipment: list[str]
    maintenance: list[dt.date]
    """Dates the room is closed for maintenance."""


class RoomList(BaseModel):
    floor: Floor | None
    min_seats: int | None
    count: int
    rooms: list[Room]


class Slot(BaseModel):
    id: str
    start: str
    end: str
    title: str
    organizer: str


class DaySchedule(BaseModel):
    room_id: str
    room_name: str
    date: dt.date
    as_of: str
    """The building's clock, 'YYYY-MM-DD HH:MM'."""
    opens: str
    closes: str
    closed: Literal["weekend", "maintenance"] | None
    bookings: list[Slot]
    """The confirmed bookings (cancelled ones free their slot), by start."""


class Booking(BaseModel):
    id: str
    room_id: str
    room_name: str
    date: dt.date
    start: str
    end: str
    title: str
    organizer: str
    attendees: int
    status: Status


RoomId = Annotated[str, Field(description="Room id, e.g. 'R-201'", min_length=1)]
BookingId = Annotated[str, Field(description="Booking id, e.g. 'BK-1007'", min_length=1)]
Day = Annotated[dt.date, Field(description="Date, 'YYYY-MM-DD'")]
Clock = Annotated[str, Field(description="Time of day, 'HH:MM' (24 h)", pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]


def minutes(clock: str) -> int:
    hours, mins = clock.split(":")
    return int(hours) * 60 + int(mins)


def hhmm(total: int) -> str:
    return f"{total // 60:02d}:{total % 60:02d}"


def business_days(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)
            if (first + dt.timedelta(days=n)).weekday() < 5]


def initial_state(seed: int) -> tuple[dt.datetime, dict[str, RoomDetail], dict[str, Booking]]:
    """The building of `seed`: its clock, its rooms with one or two closed for maintenance on a day, and the
    bookings from the last working day to three working days ahead, some cancelled, a few organizers busier
    than the rest."""
    rng = random.Random(seed)
    today = WEEK + dt.timedelta(days=rng.randint(0, 3))
    now = dt.datetime.combine(today, dt.time(8)) + dt.timedelta(minutes=5 * rng.randint(6, 96))
    days = business_days(today - dt.timedelta(days=3), today + dt.timedelta(days=5))
    days = days[days.index(today) - 1:days.index(today) + 4]
    rooms = {rid: RoomDetail(id=rid, name=name, floor=floor, seats=seats, opens=opens, closes=closes,
                             equipment=list(equipment), maintenance=[])
             for rid, (name, floor, seats, opens, closes, equipment) in ROOMS.items()}
    for rid in rng.sample(sorted(rooms), rng.randint(1, 2)):
        rooms[rid].maintenance.append(rng.choice(days[1:]))
    busy = set(rng.sample(PEOPLE, 2))
    weights = [4 if person in busy else 1 for person in PEOPLE]
    starts = [*POPULAR, "08:30", "12:00", "16:30"]
    drafts: list[Booking] = []
    for day in days:
        for room in rooms.values():
            if day in room.maintenance:
                continue
            for _ in range(rng.randint(0, 3)):
                start = rng.choices(starts, weights=[*POPULAR.values(), 1, 1, 1])[0]
                end = hhmm(minutes(start) + rng.choice([30, 60, 60, 90, 120]))
                organizer = rng.choices(PEOPLE, weights=weights)[0]
                taken = any(b.room_id == room.id and b.date == day and minutes(start) < minutes(b.end)
                            and minutes(b.start) < minutes(end) for b in drafts)
                held = sum(b.organizer == organizer and b.date == day for b in drafts)
                outside = minutes(start) < minutes(room.opens) or minutes(end) > minutes(room.closes)
                if taken or outside or held >= DAILY_LIMIT:
                    continue
                began, ended = (dt.datetime.combine(day, dt.time.fromisoformat(t)) <= now for t in (start, end))
                status = ("cancelled" if rng.random() < 0.12 else "finished" if ended else "in_progress" if began
                          else "upcoming")
                drafts.append(Booking(id="", room_id=room.id, room_name=room.name, date=day, start=start, end=end,
                                      title=rng.choice(TITLES), organizer=organizer,
                                      attendees=rng.randint(1, room.seats), status=status))
    drafts.sort(key=lambda b: (b.date, b.start, b.room_id))
    bookings: dict[str, Booking] = {}
    for n, draft in enumerate(drafts, 1001):
        draft.id = f"BK-{n}"
        bookings[draft.id] = draft
    return now, rooms, bookings


def build_server(seed: int = 0) -> MCPServer:
    """A fresh booking server whose building starts from `seed`."""
    now, rooms, bookings = initial_state(seed)
    colleagues = random.Random(seed * 7919 + 1)
    server = MCPServer("booking", instructions="Meeting-room booking: find rooms, read their schedules, book, move "
                       "and cancel meetings.", version="1.0.0", log_level="WARNING")

    def room(room_id: str) -> RoomDetail:
        if room_id not in rooms:
            raise ToolError(f"No room '{room_id}'")
        return rooms[room_id]

    def booking(booking_id: str) -> Booking:
        if booking_id not in bookings:
            raise ToolError(f"No booking '{booking_id}'")
        return bookings[booking_id]

    def confirmed(room_id: str, day: dt.date) -> list[Booking]:
        return sorted((b for b in bookings.values() if b.room_id == room_id and b.date == day
                       and b.status != "cancelled"), key=lambda b: b.start)

    def held_by(organizer: str, day: dt.date) -> list[Booking]:
        return [b for b in bookings.values() if b.organizer.casefold() == organizer.casefold() and b.date == day
                and b.status != "cancelled"]

    def add(place: RoomDetail, day: dt.date, start: str, end: str, title: str, organizer: str,
            attendees: int) -> Booking:
        new_id = f"BK-{1001 + len(bookings)}"
        bookings[new_id] = Booking(id=new_id, room_id=place.id, room_name=place.name, date=day, start=start, end=end,
                                   title=title, organizer=organizer, attendees=attendees, status="upcoming")
        return bookings[new_id]

    def check(place: RoomDetail, day: dt.date, start: str, end: str, attendees: int, organizer: str,
              moving: Booking | None = None) -> None:
        if day.weekday() >= 5:
            raise ToolError(f"The building is closed on weekends; {day} is a {day:%A}")
        if day in place.maintenance:
            raise ToolError(f"{place.id} ({place.name}) is closed for maintenance on {day}")
        for clock in (start, end):
            if minutes(clock) % 15:
                raise ToolError(f"Bookings start and end on the quarter hour; {clock} does not")
        if minutes(end) <= minutes(start):
            raise ToolError(f"End {end} is not after start {start}")
        if minutes(end) - minutes(start) > MAX_HOURS * 60:
            length = minutes(end) - minutes(start)
            raise ToolError(f"A booking lasts at most {MAX_HOURS} hours; {start}-{end} is {length // 60} h "
                            f"{length % 60:02d} min")
        if minutes(start) < minutes(place.opens) or minutes(end) > minutes(place.closes):
            raise ToolError(f"{place.id} ({place.name}) is open {place.opens}-{place.closes}; {start}-{end} is "
                            "outside its opening hours")
        in_progress = moving is not None and moving.status == "in_progress"
        first = end if in_progress else start
        if dt.datetime.combine(day, dt.time.fromisoformat(first)) <= now:
            raise ToolError(f"{day} {first} has passed (it is {now:%Y-%m-%d %H:%M}); a booking cannot "
                            f"{'end' if in_progress else 'start'} in the past")
        if attendees > place.seats:
            raise ToolError(f"{place.id} ({place.name}) seats {place.seats}; {attendees} attendees do not fit")
        for other in confirmed(place.id, day):
            if other is not moving and minutes(start) < minutes(other.end) and minutes(other.start) < minutes(end):
                raise ToolError(f"{place.id} ({place.name}) is already booked {other.start}-{other.end} on {day} "
                                f"({other.id})")
        held = [b for b in held_by(organizer, day) if b is not moving]
        if len(held) >= DAILY_LIMIT:
            raise ToolError(f"{organizer} already holds {len(held)} bookings on {day}, the most an organizer may hold "
                            "in a day")

    def walk_in(place: RoomDetail, day: dt.date) -> None:
        """Now and then a colleague takes a free popular hour of a schedule someone just read."""
        if day.weekday() >= 5 or day in place.maintenance or colleagues.random() >= COLLEAGUES:
            return
        free = [start for start in POPULAR if minutes(place.opens) <= minutes(start)
                and minutes(start) + 60 <= minutes(place.closes)
                and dt.datetime.combine(day, dt.time.fromisoformat(start)) > now
                and not any(minutes(start) < minutes(b.end) and minutes(b.start) < minutes(start) + 60
                            for b in confirmed(place.id, day))]
        who = [p for p in PEOPLE if len(held_by(p, day)) < DAILY_LIMIT]
        if free and who:
            start = colleagues.choices(free, weights=[POPULAR[s] for s in free])[0]
            add(place, day, start, hhmm(minutes(start) + 60), colleagues.choice(TITLES), colleagues.choice(who),
                colleagues.randint(1, place.seats))

    @server.tool(annotations=READ)
    def list_rooms(floor: Floor | None = None,
                   min_seats: Annotated[int | None, Field(ge=1, description="only rooms seating at least this many")]
                   = None) -> RoomList:
        """List the meeting rooms, or those of one floor or with enough seats, with their opening hours."""
        found = [Room(**r.model_dump(include=set(Room.model_fields))) for r in rooms.values()
                 if floor in (None, r.floor) and r.seats >= (min_seats or 0)]
        return RoomList(floor=floor, min_seats=min_seats, count=len(found), rooms=found)

    @server.tool(annotations=READ)
    def get_room(room_id: RoomId) -> RoomDetail:
        """Get one room: floor, seats, opening hours, equipment and the dates it is closed for maintenance."""
        return room(room_id)

    @server.tool(annotations=READ)
    def list_bookings(room_id: RoomId, date: Day) -> DaySchedule:
        """A room's confirmed bookings on one date, as of now, its opening hours and whether it is closed that
        day."""
        place = room(room_id)
        closed = "weekend" if date.weekday() >= 5 else "maintenance" if date in place.maintenance else None
        slots = [Slot(**b.model_dump(include=set(Slot.model_fields))) for b in confirmed(place.id, date)]
        schedule = DaySchedule(room_id=place.id, room_name=place.name, date=date, as_of=f"{now:%Y-%m-%d %H:%M}",
                               opens=place.opens, closes=place.closes, closed=closed, bookings=slots)
        walk_in(place, date)
        return schedule

    @server.tool(annotations=READ)
    def get_booking(booking_id: BookingId) -> Booking:
        """Get a booking: room, date, time, organizer, attendees and status (upcoming, in_progress, finished or
        cancelled)."""
        return booking(booking_id)

    @server.tool(annotations=ADD)
    def book_room(room_id: RoomId, date: Day, start: Clock, end: Clock,
                  title: Annotated[str, Field(min_length=1, max_length=80)],
                  organizer: Annotated[str, Field(min_length=1, max_length=60)],
                  attendees: Annotated[int, Field(ge=1, le=500, description="People attending, organizer included")]
                  ) -> Booking:
        """Book a room for a meeting. Bookings are made on weekdays within the room's opening hours, start and end
        on the quarter hour and last at most 4 hours; they fail if the slot has started or overlaps another
        booking, the room seats fewer than the attendees or is closed for maintenance, or the organizer already
        holds their daily limit of bookings."""
        place = room(room_id)
        check(place, date, start, end, attendees, organizer)
        return add(place, date, start, end, title, organizer, attendees)

    @server.tool(annotations=CHANGE)
    def move_booking(booking_id: BookingId, room_id: RoomId | None = None, date: Day | None = None,
                     start: Clock | None = None, end: Clock | None = None) -> Booking:
        """Move a booking to another room, date or time, or extend or shorten it (give only `end`); a new `start`
        without `end` keeps its length. The booking rules of `book_room` apply to the new slot. Finished and
        cancelled bookings cannot be moved; one in progress can only be extended or shortened."""
        old = booking(booking_id)
        if old.status == "cancelled":
            raise ToolError(f"Booking {booking_id} is cancelled; a cancelled booking cannot be moved")
        if old.status == "finished":
            raise ToolError(f"Booking {booking_id} took place on {old.date} {old.start}-{old.end}; past bookings "
                            "cannot be changed")
        place, day = room(room_id) if room_id else rooms[old.room_id], date or old.date
        new_start = start or old.start
        new_end = end or (hhmm(minutes(start) + minutes(old.end) - minutes(old.start)) if start else old.end)
        if old.status == "in_progress" and (place.id, day, new_start) != (old.room_id, old.date, old.start):
            raise ToolError(f"Booking {booking_id} is in progress (since {old.start}); it can only be extended or "
                            "shortened")
        check(place, day, new_start, new_end, old.attendees, old.organizer, moving=old)
        old.room_id, old.room_name, old.date, old.start, old.end = place.id, place.name, day, new_start, new_end
        return old

    @server.tool(annotations=CHANGE)
    def cancel_booking(booking_id: BookingId) -> Booking:
        """Cancel an upcoming booking and free its slot. Cancelled, finished and in-progress bookings cannot be
        cancelled."""
        old = booking(booking_id)
        if old.status == "cancelled":
            raise ToolError(f"Booking {booking_id} is already cancelled")
        if old.status == "finished":
            raise ToolError(f"Booking {booking_id} took place on {old.date} {old.start}-{old.end}; past bookings "
                            "cannot be cancelled")
        if old.status == "in_progress":
            raise ToolError(f"Booking {booking_id} is in progress (since {old.start}); it cannot be cancelled, only "
                            "shortened")
        old.status = "cancelled"
        return old

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Meeting-room booking MCP server (an envace-mcp example)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BOOKING_SEED", "0")),
                        help="seed of the initial building (default: $BOOKING_SEED or 0)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8011, help="HTTP port (127.0.0.1 only: there is no authentication)")
    args = parser.parse_args(argv)
    server = build_server(args.seed)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
