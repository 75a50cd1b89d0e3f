"""Which of a fit's held-out booking failures could be foreseen, and from what: for each real failure
(`examples/booking_server.py`'s refusals, read from their messages), whether the fact that decides it is in
the call itself (a time off the quarter hour, an end before its start, longer than 4 hours, a weekend), in an
earlier reply of the same run (the room's schedule showing the meeting in the way, the booking shown
cancelled or past, the room's maintenance dates, the building's clock), in the training calls (the seats and
opening hours every building shares, the ids replies showed), or in neither (an organizer's daily limit no
reply shows, a slot booked blind or taken by a colleague after it was read); beside how many of each the
fitted world model foresaw (its report.json).

    python -m envace_mcp.lab.analyses.booking_failures --traces runs/booking --fit runs/book-200
"""

from __future__ import annotations

from typing import Any

from envace_mcp.lab.analyses.inventory_failures import SOURCES as _LATER, tally
from envace_mcp.policy.fidelity import parsed_json
from envace_mcp.toolbox import ToolResult

SOURCES = ("the call", *_LATER)
ALONE = {"quarter hour": "off the quarter hour", "is not after start": "end before start",
         "at most 4 hours": "longer than 4 hours", "on weekends": "weekend"}


def shown(values: list[Any]) -> list[dict[str, Any]]:
    """The objects earlier replies showed, a schedule's slots with the schedule's room and date."""
    out = []
    for value in map(parsed_json, values):
        if not isinstance(value, dict):
            continue
        out.append(value)
        for key in ("rooms", "bookings"):
            items = value.get(key) if isinstance(value.get(key), list) else []
            out += [{"room_id": value.get("room_id"), "date": value.get("date"), **item}
                    for item in items if isinstance(item, dict)]
    return out


def why(call: Any, earlier: list[Any], ids: set[str]) -> tuple[str, str]:
    """(what failed, where the deciding fact was: one of `SOURCES`)."""
    text = ToolResult.text_of(call.result)
    args = call.request.call.arguments
    seen = shown([e.value for e in earlier if not e.failed])
    for mark, what in ALONE.items():
        if mark in text:
            return what, "the call"
    if "do not fit" in text or "opening hours" in text:
        return ("too many attendees" if "do not fit" in text else "outside opening hours"), "the training calls"
    target = [o for o in seen if o.get("id") == args.get("booking_id")]
    room, day = args.get("room_id"), args.get("date")
    if "already booked" in text:
        start, end = args.get("start"), args.get("end")
        in_way = any(o.get("room_id") == room and o.get("date") == day and o.get("status") != "cancelled"
                     and o.get("id") != args.get("booking_id") and isinstance(start, str) and isinstance(end, str)
                     and isinstance(o.get("start"), str) and isinstance(o.get("end"), str)
                     and start < o["end"] and o["start"] < end for o in seen)
        return "slot taken", "the run" if in_way else "neither"
    if "the most an organizer" in text:
        held = {o.get("id") for o in seen if o.get("organizer") == args.get("organizer") and o.get("date") == day
                and o.get("status") != "cancelled"}
        return "daily limit", "the run" if len(held) >= 3 else "neither"
    if "maintenance" in text:
        closed = any(o.get("id") == room and day in (o.get("maintenance") or []) for o in seen)
        return "closed for maintenance", "the run" if closed else "neither"
    if "has passed" in text:
        return "already started", "the run" if any("as_of" in o for o in seen) else "neither"
    if any(word in text for word in ("cancelled", "took place", "in progress")):
        return "booking not open", "the run" if any(o.get("status") not in (None, "upcoming") for o in target) else "neither"
    if "No room '" in text or "No booking '" in text:
        named = args.get("booking_id") if "No booking '" in text else args.get("room_id")
        return "unknown id", "the training calls" if named not in ids else "neither"
    return "other", "neither"


def known_ids(calls: list[Any]) -> set[str]:
    return {o["id"] for c in calls if not c.failed for o in shown([c.value]) if isinstance(o.get("id"), str)}


def main() -> None:
    tally(__doc__, "booking", known_ids, why, SOURCES)


if __name__ == "__main__":
    main()
