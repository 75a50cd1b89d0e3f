"""The held-out booking example: a meeting-room server whose failures depend on its state (and on a
colleague booking behind the agent's back), and the scripted traffic that records a replayable JSONL call
log from it."""

import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from envace_mcp.toolbox import Toolbox

EXAMPLES = Path(__file__).parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import booking_server  # noqa: E402
import booking_traffic  # noqa: E402
from booking_server import DAILY_LIMIT, build_server, initial_state, minutes  # noqa: E402

pytestmark = pytest.mark.anyio
WRITES = {"book_room", "move_booking", "cancel_booking"}
READS = {"list_rooms", "get_room", "list_bookings", "get_booking"}
FAILURES = {  # a phrase of each kind of failure the server reports
    "unknown room": "No room '", "unknown booking": "No booking '", "overlap": "is already booked",
    "seats": "attendees do not fit", "maintenance": "closed for maintenance", "quarter hour": "on the quarter hour",
    "end before start": "is not after start", "too long": "lasts at most", "opening hours": "outside its opening hours",
    "passed": "has passed", "daily limit": "the most an organizer may hold", "weekend": "closed on weekends",
    "cancelled twice": "already cancelled", "moving a cancelled": "a cancelled booking cannot be moved",
    "took place": "past bookings cannot be", "in progress": "is in progress",
}


def later_days(seed: int, room_id: str) -> list[dt.date]:
    """The working days of the next week after the building's today on which the room is open."""
    now, rooms, _ = initial_state(seed)
    days = booking_server.business_days(now.date() + dt.timedelta(days=1), now.date() + dt.timedelta(days=7))
    return [day for day in days if day not in rooms[room_id].maintenance]


def later_day(seed: int, room_id: str) -> dt.date:
    """The first working day after the building's today on which the room is open."""
    return later_days(seed, room_id)[0]


def free_slots(seed: int, room_id: str, day: dt.date, length: int = 60) -> list[tuple[str, str]]:
    """Slots of `length` minutes, on the quarter hour, in the future and within opening hours, that overlap
    neither a confirmed booking of the seed's building nor each other."""
    now, rooms, bookings = initial_state(seed)
    room = rooms[room_id]
    taken = [(minutes(b.start), minutes(b.end)) for b in bookings.values()
             if b.room_id == room_id and b.date == day and b.status != "cancelled"]
    slots: list[tuple[str, str]] = []
    start = minutes(room.opens)
    while start + length <= minutes(room.closes):
        end = start + length
        future = dt.datetime.combine(day, dt.time.fromisoformat(booking_server.hhmm(start))) > now
        if future and not any(start < b and a < end for a, b in taken):
            slots.append((booking_server.hhmm(start), booking_server.hhmm(end)))
            taken.append((start, end))
            start = end
        else:
            start += 15
    return slots


def meeting(room_id: str, day: dt.date, slot: tuple[str, str], organizer: str = "Zoe", attendees: int = 2) -> dict:
    """`book_room`'s arguments; Zoe is nobody in the building, so holds no booking yet."""
    return {"room_id": room_id, "date": str(day), "start": slot[0], "end": slot[1], "title": "Planning",
            "organizer": organizer, "attendees": attendees}


def stdio_config(seed: int) -> dict:
    """examples/booking.json as shipped, launched with this interpreter on the seed's building."""
    config = json.loads((EXAMPLES / "booking.json").read_text())
    entry = config["mcpServers"]["booking"]
    entry |= {"command": sys.executable, "args": [str(EXAMPLES / "booking_server.py")],
              "env": {"BOOKING_SEED": str(seed)}}
    return config


def failure_kind(call: dict) -> str:
    text = call["result"]["content"][0]["text"]
    return next(kind for kind, phrase in FAILURES.items() if phrase in text)


async def test_a_slot_overlapping_a_booking_fails_and_a_free_slot_of_the_room_succeeds():
    now, _, bookings = initial_state(3)
    taken = next(b for b in bookings.values() if b.status == "upcoming" and b.date > now.date())
    inside = (booking_server.hhmm(minutes(taken.start) + 15), booking_server.hhmm(minutes(taken.end) + 15))
    free = free_slots(3, taken.room_id, taken.date)[0]
    async with Toolbox({"booking": build_server(3)}) as toolbox:
        with anyio.fail_after(10):
            overlapping = await toolbox.call("book_room", meeting(taken.room_id, taken.date, inside, attendees=1))
            booked = await toolbox.call("book_room", meeting(taken.room_id, taken.date, free, attendees=1))
            same_again = await toolbox.call("book_room", meeting(taken.room_id, taken.date, free, "Yara", 1))
    assert overlapping.error_kind == "tool_error" and overlapping.structured_content is None
    assert (f"{taken.room_id} ({taken.room_name}) is already booked {taken.start}-{taken.end} on {taken.date} "
            f"({taken.id})") in overlapping.text
    assert not booked.is_error
    assert booked.structured_content == {
        "id": f"BK-{1001 + len(bookings)}", "room_id": taken.room_id, "room_name": taken.room_name,
        "date": str(taken.date), "start": free[0], "end": free[1], "title": "Planning", "organizer": "Zoe",
        "attendees": 1, "status": "upcoming"}
    # the slot that was free a moment ago is now taken by the booking just made
    assert same_again.is_error and f"is already booked {free[0]}-{free[1]}" in same_again.text
    assert f"({booked.structured_content['id']})" in same_again.text


async def test_a_cancelled_booking_cannot_be_cancelled_again_and_its_slot_is_free():
    day = later_day(0, "R-201")
    slot = free_slots(0, "R-201", day)[0]
    async with Toolbox({"booking": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            booked = (await toolbox.call("book_room", meeting("R-201", day, slot))).structured_content
            cancelled = await toolbox.call("cancel_booking", {"booking_id": booked["id"]})
            twice = await toolbox.call("cancel_booking", {"booking_id": booked["id"]})
            stored = (await toolbox.call("get_booking", {"booking_id": booked["id"]})).structured_content
            rebooked = await toolbox.call("book_room", meeting("R-201", day, slot, organizer="Yara"))
    assert booked["status"] == "upcoming"
    assert not cancelled.is_error and cancelled.structured_content == {**booked, "status": "cancelled"}
    assert twice.error_kind == "tool_error" and twice.structured_content is None
    assert f"Booking {booked['id']} is already cancelled" in twice.text
    assert stored == {**booked, "status": "cancelled"}
    assert not rebooked.is_error and rebooked.structured_content["start"] == slot[0]


async def test_a_cancelled_booking_cannot_be_moved():
    seeded = next(b for b in initial_state(4)[2].values() if b.status == "cancelled")
    day = later_day(4, "R-102")
    slot, elsewhere = free_slots(4, "R-102", day)[:2]
    async with Toolbox({"booking": build_server(4)}) as toolbox:
        with anyio.fail_after(10):
            booked = (await toolbox.call("book_room", meeting("R-102", day, slot))).structured_content
            await toolbox.call("cancel_booking", {"booking_id": booked["id"]})
            moved = await toolbox.call("move_booking", {"booking_id": booked["id"], "start": elsewhere[0]})
            moved_seeded = await toolbox.call("move_booking", {"booking_id": seeded.id, "end": "17:00"})
            stored = (await toolbox.call("get_booking", {"booking_id": booked["id"]})).structured_content
    assert moved.error_kind == "tool_error"
    assert f"Booking {booked['id']} is cancelled; a cancelled booking cannot be moved" in moved.text
    assert moved_seeded.is_error and f"Booking {seeded.id} is cancelled;" in moved_seeded.text
    assert stored == {**booked, "status": "cancelled"}  # the failed move left it where it was


async def test_more_attendees_than_seats_fails_and_exactly_the_seats_succeed():
    _, rooms, _ = initial_state(1)
    ember = rooms["R-301"]
    day = later_day(1, ember.id)
    slot = free_slots(1, ember.id, day)[0]
    async with Toolbox({"booking": build_server(1)}) as toolbox:
        with anyio.fail_after(10):
            crowded = await toolbox.call("book_room", meeting(ember.id, day, slot, attendees=ember.seats + 1))
            full = await toolbox.call("book_room", meeting(ember.id, day, slot, attendees=ember.seats))
    assert ember.seats == 2
    assert crowded.is_error and "R-301 (Ember) seats 2; 3 attendees do not fit" in crowded.text
    assert not full.is_error and full.structured_content["attendees"] == 2


async def test_a_room_closed_for_maintenance_cannot_be_booked_that_day():
    _, rooms, _ = initial_state(0)
    closed = next(r for r in rooms.values() if r.maintenance)
    day = closed.maintenance[0]
    open_day = later_day(0, closed.id)
    slot = free_slots(0, closed.id, open_day)[0]
    async with Toolbox({"booking": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            room = (await toolbox.call("get_room", {"room_id": closed.id})).structured_content
            schedule = await toolbox.call("list_bookings", {"room_id": closed.id, "date": str(day)})
            refused = await toolbox.call("book_room", meeting(closed.id, day, ("10:00", "11:00")))
            booked = await toolbox.call("book_room", meeting(closed.id, open_day, slot))
    assert room["maintenance"] == [str(day)]
    assert schedule.structured_content["closed"] == "maintenance" and schedule.structured_content["bookings"] == []
    assert refused.is_error and f"{closed.id} ({closed.name}) is closed for maintenance on {day}" in refused.text
    assert not booked.is_error and booked.structured_content["date"] == str(open_day)


async def test_a_booking_must_end_after_it_starts():
    day = later_day(2, "R-202")
    async with Toolbox({"booking": build_server(2)}) as toolbox:
        with anyio.fail_after(10):
            backwards = await toolbox.call("book_room", meeting("R-202", day, ("11:00", "10:00")))
            empty = await toolbox.call("book_room", meeting("R-202", day, ("11:00", "11:00")))
    assert backwards.error_kind == "tool_error" and "End 10:00 is not after start 11:00" in backwards.text
    assert empty.error_kind == "tool_error" and "End 11:00 is not after start 11:00" in empty.text


async def test_a_booking_starts_and_ends_on_the_quarter_hour():
    day = later_day(2, "R-202")
    async with Toolbox({"booking": build_server(2)}) as toolbox:
        with anyio.fail_after(10):
            odd_start = await toolbox.call("book_room", meeting("R-202", day, ("10:10", "11:00")))
            odd_end = await toolbox.call("book_room", meeting("R-202", day, ("10:00", "10:20")))
            not_a_time = await toolbox.call("book_room", meeting("R-202", day, ("10:00", "25:00")))
    assert odd_start.error_kind == "tool_error"
    assert "Bookings start and end on the quarter hour; 10:10 does not" in odd_start.text
    assert odd_end.error_kind == "tool_error" and "; 10:20 does not" in odd_end.text
    assert not_a_time.error_kind == "invalid_arguments"  # the schema's pattern: the server is never asked


async def test_an_organizer_hits_the_daily_limit_on_the_booking_after_it():
    day, other_day = later_days(5, "R-202")[:2]
    slots = free_slots(5, "R-202", day, length=30)[:DAILY_LIMIT + 1]
    assert len(slots) == DAILY_LIMIT + 1 and DAILY_LIMIT == 3
    async with Toolbox({"booking": build_server(5)}) as toolbox:
        with anyio.fail_after(10):
            held = [await toolbox.call("book_room", meeting("R-202", day, slot)) for slot in slots[:DAILY_LIMIT]]
            over = await toolbox.call("book_room", meeting("R-202", day, slots[DAILY_LIMIT], organizer="zoe"))
            other = await toolbox.call("book_room", meeting("R-202", other_day, free_slots(5, "R-202", other_day)[0]))
            await toolbox.call("cancel_booking", {"booking_id": held[0].structured_content["id"]})
            after_cancel = await toolbox.call("book_room", meeting("R-202", day, slots[DAILY_LIMIT]))
    assert [h.is_error for h in held] == [False] * DAILY_LIMIT
    # the organizer's name is matched without case; the reply names them as the call did
    assert over.error_kind == "tool_error"
    assert f"zoe already holds 3 bookings on {day}, the most an organizer may hold in a day" in over.text
    assert not other.is_error  # the limit is per day
    assert not after_cancel.is_error and after_cancel.structured_content["start"] == slots[DAILY_LIMIT][0]


async def test_an_unknown_room_fails_with_its_id():
    day = later_day(0, "R-101")
    upcoming = next(b for b in initial_state(0)[2].values() if b.status == "upcoming")
    async with Toolbox({"booking": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            booked = await toolbox.call("book_room", meeting("R-999", day, ("10:00", "11:00")))
            room = await toolbox.call("get_room", {"room_id": "R-109"})
            schedule = await toolbox.call("list_bookings", {"room_id": "R-110", "date": str(day)})
            moved = await toolbox.call("move_booking", {"booking_id": upcoming.id, "room_id": "R-1010"})
            unknown_booking = await toolbox.call("get_booking", {"booking_id": "BK-9999"})
    assert booked.error_kind == "tool_error" and booked.structured_content is None
    assert "No room 'R-999'" in booked.text
    assert room.is_error and "No room 'R-109'" in room.text
    assert schedule.is_error and "No room 'R-110'" in schedule.text
    assert moved.is_error and "No room 'R-1010'" in moved.text
    assert unknown_booking.is_error and "No booking 'BK-9999'" in unknown_booking.text


async def test_the_tools_declare_their_annotations_and_output_schemas():
    async with Toolbox({"booking": build_server(0)}) as toolbox:
        catalog = {tool.name: tool for tool in toolbox.catalog}
    declared = {name: (t.annotations.read_only, t.annotations.destructive, t.annotations.idempotent)
                for name, t in catalog.items()}
    assert declared == {
        "list_rooms": (True, False, True), "get_room": (True, False, True), "list_bookings": (True, False, True),
        "get_booking": (True, False, True), "book_room": (False, False, False),
        "move_booking": (False, True, True), "cancel_booking": (False, True, True),
    }
    assert all(not t.annotations.open_world and t.output_schema for t in catalog.values())
    booking_fields = {"id", "room_id", "date", "start", "end", "organizer", "attendees", "status"}
    for tool in ("get_booking", "book_room", "move_booking", "cancel_booking"):
        assert booking_fields <= set(catalog[tool].output_schema["properties"]), tool
    assert {"as_of", "closed", "bookings"} <= set(catalog["list_bookings"].output_schema["properties"])
    assert {"seats", "maintenance"} <= set(catalog["get_room"].output_schema["properties"])


def test_the_building_is_a_function_of_its_seed():
    now, rooms, bookings = initial_state(5)
    assert (now, rooms, bookings) == initial_state(5)
    assert bookings != initial_state(6)[2]
    assert booking_server.WEEK <= now.date() <= booking_server.WEEK + dt.timedelta(days=3)
    assert dt.time(8, 30) <= now.time() <= dt.time(16)
    assert set(rooms) == set(booking_server.ROOMS)
    closed = [r for r in rooms.values() if r.maintenance]
    assert 1 <= len(closed) <= 2 and all(len(r.maintenance) == 1 and r.maintenance[0] >= now.date() for r in closed)
    assert list(bookings) == [f"BK-{n}" for n in range(1001, 1001 + len(bookings))]
    assert len(bookings) >= 20 and {b.status for b in bookings.values()} == {
        "upcoming", "in_progress", "finished", "cancelled"}
    confirmed = [b for b in bookings.values() if b.status != "cancelled"]
    for b in confirmed:
        room = rooms[b.room_id]
        start, end = (dt.datetime.combine(b.date, dt.time.fromisoformat(t)) for t in (b.start, b.end))
        assert b.status == ("finished" if end <= now else "in_progress" if start <= now else "upcoming"), b.id
        assert b.date.weekday() < 5 and b.date not in room.maintenance and 1 <= b.attendees <= room.seats
        assert minutes(room.opens) <= minutes(b.start) < minutes(b.end) <= minutes(room.closes)
        assert not any(o is not b and o.room_id == b.room_id and o.date == b.date
                       and minutes(b.start) < minutes(o.end) and minutes(o.start) < minutes(b.end) for o in confirmed)
    assert max(Counter((b.organizer, b.date) for b in confirmed).values()) <= DAILY_LIMIT


async def test_the_shipped_config_serves_the_same_building_over_stdio():
    config = stdio_config(4)
    assert config["mcpServers"]["booking"]["sandbox"] is True
    now, rooms, bookings = initial_state(4)
    closed = next(r for r in rooms.values() if r.maintenance)
    busiest = Counter((b.room_id, str(b.date)) for b in bookings.values() if b.status != "cancelled").most_common(1)
    (room_id, day), count = busiest[0]
    calls = [("get_room", {"room_id": closed.id}), ("list_bookings", {"room_id": room_id, "date": day}),
             ("list_bookings", {"room_id": "R-202", "date": str(later_day(4, "R-202"))}),
             ("list_bookings", {"room_id": "R-202", "date": str(later_day(4, "R-202"))})]
    replies = {}
    for where, servers in (("stdio", config), ("in-process", {"booking": build_server(4)})):
        async with Toolbox(servers) as toolbox:
            with anyio.fail_after(30):
                replies[where] = [(await toolbox.call(tool, arguments)).structured_content for tool, arguments in calls]
    assert replies["stdio"] == replies["in-process"]
    assert replies["stdio"][0]["maintenance"] == [str(closed.maintenance[0])]
    assert len(replies["stdio"][1]["bookings"]) == count >= 2
    assert replies["stdio"][1]["as_of"] == f"{now:%Y-%m-%d %H:%M}"


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("booking") / "log.jsonl"
    run = subprocess.run([sys.executable, str(EXAMPLES / "booking_traffic.py"), "--episodes", "150", "--seed", "0",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "150 episodes" in run.stdout and "writes failed" in run.stdout
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_traffic_log_has_one_episode_a_line_in_the_import_format(log):
    assert [e["id"] for e in log] == [f"s0-ep{k:04d}" for k in range(150)]
    for episode in log:
        assert set(episode) == {"id", "task", "calls"} and episode["task"]
        assert 2 <= len(episode["calls"]) <= 7
        for call in episode["calls"]:
            assert set(call) == {"tool", "arguments", "result"} and isinstance(call["arguments"], dict)
            assert call["tool"] in READS | WRITES
            result = call["result"]
            assert result["content"][0]["type"] == "text" and isinstance(result["isError"], bool)
            assert ("structuredContent" in result) is not result["isError"]


def test_agents_mostly_read_before_they_write(log):
    # only a careless agent opens with a write: interviews booked blind, or a cancellation without a look
    opening = Counter(e["calls"][0]["tool"] for e in log)
    assert {tool for tool in opening if tool in WRITES} == {"book_room", "cancel_booking"}
    assert sum(opening[tool] for tool in WRITES) < len(log) * 0.2
    assert all(e["calls"][0]["tool"] in READS for e in log if any(c["tool"] == "move_booking" for c in e["calls"]))


async def test_careful_agents_read_first_and_fail_only_where_no_reply_warned_them():
    careful = await booking_traffic.record(60, seed=0, careless=0.0)
    assert all(e["calls"][0]["tool"] in READS for e in careful)
    failed = [c for e in careful for c in e["calls"] if c["result"]["isError"]]
    # a colleague took the slot just seen free, or the organizer reached the daily limit no reply shows
    assert {c["tool"] for c in failed} == {"book_room"}
    assert {failure_kind(c) for c in failed} == {"overlap", "daily limit"}


def test_about_a_third_of_the_writes_fail_in_many_ways(log):
    writes = [c for e in log for c in e["calls"] if c["tool"] in WRITES]
    failed = [c for c in writes if c["result"]["isError"]]
    assert 0.25 <= len(failed) / len(writes) <= 0.40
    assert {c["tool"] for c in failed} == WRITES  # every write tool fails somewhere
    kinds = Counter(failure_kind(c) for c in failed)
    assert len(kinds) >= 8
    assert {"overlap", "daily limit", "seats", "end before start", "quarter hour", "unknown room"} <= set(kinds)
    # most failures come from the building's state, not from a mistyped id
    assert kinds["unknown room"] + kinds["unknown booking"] < len(failed) / 4
    mixed = [e for e in log if {c["result"]["isError"] for c in e["calls"]} == {True, False}]
    clean = [e for e in log if not any(c["result"]["isError"] for c in e["calls"])]
    assert len(mixed) >= 20 and len(clean) >= 50


def colleague_took_the_slot(episode: dict) -> bool:
    """Whether a booking failed on an overlap with a slot that a schedule read earlier in the episode showed
    free: a colleague's booking made in between."""
    calls = episode["calls"]
    for n, read in enumerate(calls):
        if read["tool"] != "list_bookings" or read["result"]["isError"]:
            continue
        for write in calls[n + 1:]:
            args = write["arguments"]
            if (write["tool"] == "book_room" and write["result"]["isError"] and failure_kind(write) == "overlap"
                    and (args["room_id"], args["date"]) == (read["arguments"]["room_id"], read["arguments"]["date"])
                    and booking_traffic.free(read["result"]["structuredContent"], args["start"], args["end"])):
                return True
    return False


async def test_the_log_replays_exactly_against_a_fresh_server(log):
    surprised = [k for k, episode in enumerate(log) if colleague_took_the_slot(episode)]
    assert len(surprised) >= 2  # colleagues book between calls: a replay must reproduce them too
    for k in sorted({0, 1, 7, 42, *surprised[:4]}):
        async with Toolbox({"booking": build_server(booking_traffic.world_seed(0, k))}) as toolbox:
            again = booking_traffic.Session(toolbox)  # recorded as the traffic records
            with anyio.fail_after(10):
                for call in log[k]["calls"]:
                    await again(call["tool"], **call["arguments"])
                    assert again.calls[-1] == call, (k, call["tool"])


async def test_the_traffic_is_deterministic_for_a_seed_and_the_same_over_stdio():
    first = await booking_traffic.record(20, seed=1)
    assert first == await booking_traffic.record(20, seed=1)
    assert first != await booking_traffic.record(20, seed=2)
    # a server process per episode, its building chosen by BOOKING_SEED: the very same log
    with anyio.fail_after(60):
        assert await booking_traffic.record(2, seed=1, servers=stdio_config(0)) == first[:2]
