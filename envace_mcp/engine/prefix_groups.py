"""Shared prompt prefixes of a decode batch: rows whose prompts start alike form a group whose common
prefix is held once (positions 0..P-1) while each row's columns hold only what follows, so a step reads
the prefix once instead of once per row (GRPO rollouts: the act rows share the act system prompt and
tool schemas, the rehearse rows theirs, most of each prompt).

A row joins the group it shares most with; sharing less than the group's prefix shortens it (the tail
is copied into the group's rows' columns first); sharing too little starts a new group, or none.
`PrefixSharing` is the part of `DecodeBatch` that decides and keeps this; the batch owns the buffers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from envace_mcp.engine.attention import SharedPrefixes
from envace_mcp.engine.prefix_cache import common_prefix


@dataclass(eq=False)
class PrefixGroup:
    """A prompt prefix some rows of a decode batch start with; its keys/values are held once."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # from its first row placed


class PrefixSharing:
    """How a `DecodeBatch` groups its rows by shared prompt prefix (see the module docstring). It works on
    the batch's buffers and row bookkeeping, declared here, and moves columns with the batch's `_shift`."""

    min_shared = 64
    """A prefix shorter than this is not worth a group (two attention calls instead of one)."""
    max_groups = 4
    """More groups than this and a prompt joins the group it shares most with (if >= `min_shared`)."""

    groups: list[PrefixGroup]
    row_groups: list[PrefixGroup | None]  # each row's group (None: its columns hold its whole prompt)
    starts: list[int]  # first column of each row's prompt
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    device: torch.device

    def _shift(self, by: int) -> None:  # the batch's: moves every live row's columns
        raise NotImplementedError

    def _bind(self, rows: int | None = None) -> None:  # the batch's: points its cache at the buffers
        raise NotImplementedError

    def prefix_slots(self) -> int:
        return sum(len(group.ids) for group in self.groups)

    def forget(self, group: PrefixGroup | None) -> None:
        """Drop a prefix group `make_room` made for a row that never came (its prefill failed)."""
        if group is not None and not group.layers and all(g is not group for g in self.row_groups):
            self.groups.remove(group)

    def _best_group(self, ids: list[int]) -> tuple[PrefixGroup | None, int]:
        """Where a prompt would go, without changing anything: (a group, the tokens it would share with
        it) to join; (None, n) to start a new group of its first n tokens; (None, 0) for no group."""
        best, share = None, 0
        for group in self.groups:
            n = common_prefix(group.ids, ids, limit=len(ids) - 1)  # the row keeps one token of its own
            if n > share:
                best, share = group, n
        full = len(self.groups) >= self.max_groups
        if best is not None and share >= self.min_shared and (2 * share >= len(best.ids) or full):
            return best, share
        return None, len(ids) - 1 if not full and len(ids) - 1 >= self.min_shared else 0

    def _group_for(self, ids: list[int]) -> PrefixGroup | None:
        """The group a prompt joins (shortened to what they share), a new group, or None."""
        best, share = self._best_group(ids)
        if best is not None:
            if share < len(best.ids):
                self._shorten(best, share)
            return best
        if not share:
            return None
        group = PrefixGroup(list(ids[:share]))
        self.groups.append(group)
        return group

    def _shorten(self, group: PrefixGroup, n: int) -> None:
        """Make `group` share only its first `n` tokens: the rest go into its rows' columns, before their
        own (the buffers grow on the left when one of them has no free columns there)."""
        cut = len(group.ids) - n
        members = self._members(group)
        if members:
            shift = self._shortening_shift(group, cut)
            if shift:  # shift every row right by the missing columns
                self._shift(shift)
            for layer, (keys, values) in enumerate(group.layers):
                for slot in members:
                    start = self.starts[slot]
                    self.keys[layer][slot, :, start - cut : start] = keys[0, :, n:]
                    self.values[layer][slot, :, start - cut : start] = values[0, :, n:]
            for slot in members:
                self.mask[slot, self.starts[slot] - cut : self.starts[slot]] = 1
                self.starts[slot] -= cut
            self._bind()
        group.ids = group.ids[:n]
        group.layers = [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in group.layers]

    def _members(self, group: PrefixGroup) -> list[int]:
        return [slot for slot, g in enumerate(self.row_groups) if g is group]

    def _shortening_shift(self, group: PrefixGroup, cut: int) -> int:
        """Columns every row moves right when `group` hands its last `cut` prefix tokens to its rows'
        columns (`_shorten`): what its row with the fewest free columns on the left lacks."""
        return max(0, cut - min((self.starts[slot] for slot in self._members(group)), default=cut))

    def _prefixes(self) -> SharedPrefixes:
        members: dict[int, tuple[PrefixGroup, list[int]]] = {}
        for slot, group in enumerate(self.row_groups):
            if group is not None:
                members.setdefault(id(group), (group, []))[1].append(slot)
        return SharedPrefixes([(torch.tensor(slots, device=self.device), group.layers)
                               for group, slots in members.values()])
