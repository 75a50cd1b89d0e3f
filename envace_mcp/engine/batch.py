"""The decode batch: every row's keys/values in one buffer per layer, rows joining and leaving at any
token step, shared prompt prefixes held once (`prefix_groups`), all within a memory budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from envace_mcp.engine.attention import PREFIX_KW, ROWS_KW, RowColumns
from envace_mcp.engine.cache_layers import plain_layers, preallocated_layer
from envace_mcp.engine.prefix_groups import PrefixGroup, PrefixSharing

if TYPE_CHECKING:
    from transformers import Cache, PreTrainedModel

__all__ = ["DecodeBatch", "PrefixGroup", "plain_layers", "preallocated_layer"]


class DecodeBatch(PrefixSharing):
    """The decode batch's keys/values: one buffer per layer, (rows, kv heads, columns, head dim).

    All rows write their next token in the same column (`seen`); each row's prompt sits right-aligned
    before the column that was current when it joined, and the attention mask hides every column a
    row does not own (its left padding, and the gap when a longer prompt joined later). Position ids
    are per row, so a row's positions do not depend on where its columns are. Rows leave by
    swapping the last row into their slot (one row copied). Models with other cache layers than plain
    full attention (sliding windows) decode one row at a time with the library's cache object.

    With `shared_prefix` (CPU models on the packed decode attention), rows whose prompts start alike
    form groups (`PrefixGroup`): a group's common prefix is kept once and its rows' columns hold only
    what follows (`PrefixSharing` decides the groups, see `prefix_groups`).

    Batch-invariant rows (`place(..., alone=True)`: greedy ones, see `invariant`) join no group and
    attend alone over their own columns (`RowColumns`); while one is in the batch, every step is padded
    with filler rows to a multiple of `row_tile` rows, so each row's linear layers see the same kernel
    whatever the number of rows.
    """

    compact_from = 256
    """Leading columns no live row uses are dropped once there are this many and they are half the buffer."""

    def __init__(self, model: PreTrainedModel, cache_kw: str, device: torch.device, max_rows: int, *, joinable: bool,
                 shared_prefix: bool = False, budget_bytes: float | None = None, row_tile: int = 1) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kw, self.device, self.max_rows = model, cache_kw, device, max_rows
        self.budget_bytes = budget_bytes  # `Engine.kv_budget_gb`
        self.budget: int | None = None
        """The budget in key/value slots (rows x columns + shared prefix tokens), once the first row's
        keys/values tell the bytes a slot takes (all layers); None: no budget (or no row yet)."""
        self.cache = DynamicCache(config=model.config)
        self.joinable = joinable  # `plain_layers(model.config)`
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.rows = 0  # live rows: slots [0, rows)
        self.seen = 0  # columns in use; the next token of every row goes to column `seen`
        self.starts: list[int] = []  # first column of each row's prompt
        self.wanted = (0, 0)  # rows x columns `place` needs (set by `make_room`)
        self.shared_prefix = shared_prefix and joinable and max_rows > 1  # one row: nothing to share with
        self.groups: list[PrefixGroup] = []
        self.row_groups: list[PrefixGroup | None] = []  # each row's group (None: its columns hold its whole prompt)
        self.alone: list[bool] = []  # each row: batch-invariant (attends alone, `RowColumns`)
        self.row_tile = row_tile  # `invariant.row_tile`: steps with an `alone` row are padded to a multiple

    # -- membership

    def make_room(self, prompts: list[list[int]], new_tokens: list[int], remaining: list[int],
                  alone: list[bool] | None = None) -> list[PrefixGroup | None]:
        """Get ready for rows with `prompts` (`place` adds them one by one, so the prefilled keys/values
        of a whole group of arrivals never sit in memory next to the batch at once); returns the prefix
        group of each, for `place` (none for a row that will be `alone`)."""
        alone = alone or [False] * len(prompts)
        plans = [None if solo or not self.shared_prefix else self._group_for(ids) for ids, solo in zip(prompts, alone)]
        lengths = [len(ids) - (len(group.ids) if group else 0) for ids, group in zip(prompts, plans)]
        seen = max([self.seen, *lengths])
        self.wanted = (self.rows + len(lengths), seen + max([*new_tokens, *remaining]))
        if self.keys:
            self._reserve(*self.wanted)
            self.mask[: self.rows, self.seen:seen] = 0  # existing rows skip the columns of a longer new prompt
        self.seen = seen
        self._bind()
        return plans

    def slots(self) -> int:
        """Key/value token slots held: the buffers' rows x columns (padding included), and each shared
        prefix once."""
        return self.mask.shape[0] * self.mask.shape[1] + self.prefix_slots()

    def slots_with(self, prompt: list[int], new_tokens: int, remaining: list[int], *, trimmed: bool = False,
                   alone: bool = False) -> int:
        """What `slots` would be, about, with one more row for `prompt` (without changing the batch):
        the buffers as they are if the row fits in them, else the rows then in use times the columns
        they span; plus the shared prefixes. `trimmed`: as if `trim` had dropped the rows no one uses."""
        # as `_group_for` decides, without changing anything: a new group holds its prefix once, and a group
        # the prompt shares less with gives up tokens of its prefix to its rows' columns
        best, share = self._best_group(prompt) if self.shared_prefix and not alone else (None, 0)
        tail, prefix, seen = len(prompt) - share, share if best is None else 0, self.seen
        if best is not None and share < len(best.ids):  # joining shortens the group (`_shorten`)
            cut = len(best.ids) - share  # prefix tokens that move into its rows' columns
            prefix = -cut
            seen += self._shortening_shift(best, cut)
        rows = self._padded(self.rows + 1, alone or any(self.alone))
        columns = max(seen, tail) + max([new_tokens, *remaining])
        have_rows, have_cols = self.mask.shape
        have_rows = min(have_rows, self.rows) if trimmed else have_rows
        held = have_rows * have_cols if rows <= have_rows and columns <= have_cols else rows * columns  # or regrown
        return held + self.prefix_slots() + prefix

    def fits(self, prompt: list[int], new_tokens: int, remaining: list[int], alone: bool = False) -> bool:
        """Whether one more row for `prompt` keeps the batch within its budget (`slots_with`), after
        dropping buffer rows no one uses if that makes the difference."""
        if self.budget is None or self.slots_with(prompt, new_tokens, remaining, alone=alone) <= self.budget:
            return True
        if self.slots_with(prompt, new_tokens, remaining, trimmed=True, alone=alone) > self.budget:
            return False  # it waits (no copy for nothing)
        self.trim()
        return True

    def place(self, kv: list[tuple[torch.Tensor, torch.Tensor]], group: PrefixGroup | None = None,
              alone: bool = False) -> None:
        """Add one prefilled row (per-layer (1, kv heads, n, head dim)) right-aligned before `seen`; with
        its prefix `group` (from `make_room`) only the tokens after the group's prefix go in; `alone`:
        a batch-invariant row (see the class docstring)."""
        if group is not None:
            shared = len(group.ids)
            if not group.layers:  # copied: the row's own tensors hold its whole prompt
                group.layers = [(k[:, :, :shared].clone(), v[:, :, :shared].clone()) for k, v in kv]
            kv = [(k[:, :, shared:], v[:, :, shared:]) for k, v in kv]
        self._reserve(*self.wanted, like=kv)
        slot, n, seen = self.rows, kv[0][0].shape[2], self.seen
        self.mask[slot] = 0
        self.mask[slot, seen - n:seen] = 1
        for layer, (keys, values) in enumerate(kv):
            self.keys[layer][slot, :, seen - n:seen] = keys[0]
            self.values[layer][slot, :, seen - n:seen] = values[0]
        self.starts.append(seen - n)
        self.row_groups.append(group)
        self.alone.append(alone)
        self.rows += 1
        self._bind()

    def remove(self, slot: int) -> None:
        """Drop a row: the last row moves into its slot (row order is the caller's list order too)."""
        last = self.rows - 1
        if self.joinable:
            if slot != last:
                for buf in (*self.keys, *self.values):
                    buf[slot, :, : self.seen] = buf[last, :, : self.seen]
                self.mask[slot, : self.seen] = self.mask[last, : self.seen]
                self.starts[slot] = self.starts[last]
            gone = self.row_groups[slot]
            self.row_groups[slot] = self.row_groups[last]
            self.alone[slot] = self.alone[last]
            self.starts.pop()
            self.row_groups.pop()
            self.alone.pop()
            if gone is not None and all(group is not gone for group in self.row_groups):
                self.groups.remove(gone)
            self.rows = last
            self._compact()
            self._bind()
        else:  # the one row of a library cache (`start_alone`)
            self.rows = 0

    # -- one step

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed each row's last token; (rows, vocab) float32 logits for the next one."""
        if self.rows == 1 and self.row_groups and self.row_groups[0] is not None:
            # one row left: the split attention only costs (~15 % of a one-row step); its prefix goes back in
            group = self.row_groups[0]
            self._shorten(group, 0)
            self.groups.remove(group)
            self.row_groups[0] = None
        rows = self.rows
        padded = self._padded(rows, self.joinable and any(self.alone))
        if self.joinable and (self.seen + 1 > self.mask.shape[1] or padded > self.mask.shape[0]):
            self._reserve(padded, self.seen + 1)
            self._bind()
        if self.mask.shape[1] <= self.seen:  # plain library cache: the mask grows with it
            self.mask = torch.cat([self.mask, self.mask.new_zeros(self.mask.shape[0], 1)], dim=1)
        self.mask[:rows, self.seen] = 1
        extra = {}
        if self.groups:
            extra[PREFIX_KW] = self._prefixes()
        if padded > rows:  # filler rows (slots no live row uses) attend to their one new column; dropped below
            self.mask[rows:padded] = 0
            self.mask[rows:padded, self.seen] = 1
            tokens, positions = [*tokens, *[0] * (padded - rows)], [*positions, *[0] * (padded - rows)]
            self._bind(padded)
        if any(self.alone):
            extra[ROWS_KW] = self._alone_columns(padded)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        try:
            out = self.model(input_ids=ids, attention_mask=self.mask[:padded, : self.seen + 1], position_ids=pos,
                             use_cache=True, **{self.cache_kw: self.cache}, **extra)
        finally:
            if padded > rows:
                self.mask[rows:padded] = 0
        self.seen += 1
        if self.joinable:
            self._bind()
        return out.logits[:rows, -1, :].float()

    def _padded(self, rows: int, alone: bool) -> int:
        """Rows a step runs: `rows`, rounded up to a multiple of `row_tile` while a row is batch-invariant."""
        return -(-rows // self.row_tile) * self.row_tile if alone else rows

    def _alone_columns(self, padded: int) -> RowColumns:
        """The batch-invariant rows of this step and each one's columns (of the step's `seen + 1`)."""
        rows, columns = [], []
        for slot in range(self.rows):
            if not self.alone[slot]:
                continue
            own = torch.nonzero(self.mask[slot, : self.seen + 1]).squeeze(1)
            first, last = int(own[0]), int(own[-1])
            rows.append(slot)
            columns.append(slice(first, last + 1) if last - first + 1 == own.numel() else own)
        return RowColumns(rows, columns, every=len(rows) == self.rows and not self.groups)

    # -- storage

    def _reserve(self, rows: int, columns: int, like: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Make the buffers hold at least `rows` x `columns` (grown with slack: one copy when grown).
        `like`: one prompt's per-layer keys/values, for the shapes of the first buffers."""
        have_rows, have_cols = self.mask.shape
        if rows <= have_rows and columns <= have_cols:
            return
        need_rows, need_cols = rows, columns
        rows = max(rows, min(2 * have_rows, self.max_rows))  # rows join one by one: grow by doubling
        columns = max(columns, have_cols + max(have_cols // 4, 64)) if columns > have_cols else have_cols
        if self.budget is not None:  # slack only within the budget: a regrown buffer may drop rows no one uses
            room = max(self.budget - self.prefix_slots(), 0)  # the shared prefixes count too
            rows = max(need_rows, self.rows, min(rows, room // max(columns, 1)))
            columns = max(need_cols, min(columns, room // max(rows, 1)))
        self._resize(rows, columns, like)

    def trim(self) -> bool:
        """Drop the buffer rows no live row uses (rows that left keep their slots until the buffers are
        regrown); True if there were any."""
        if not self.keys or self.mask.shape[0] <= self.rows:
            return False
        self._resize(self.rows, self.mask.shape[1])
        self._bind()
        return True

    def _resize(self, rows: int, columns: int, like: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        have_cols = self.mask.shape[1]
        used = min(self.seen, have_cols)
        mask = self.mask.new_zeros((rows, columns))
        mask[: self.rows, :used] = self.mask[: self.rows, :used]
        self.mask = mask
        self._unbind()  # views of the old buffers: let each go once copied
        if not self.keys:
            if self.budget_bytes is not None and like:
                slot = sum(k[0, :, 0].numel() * k.element_size() + v[0, :, 0].numel() * v.element_size() for k, v in like)
                self.budget = max(1, int(self.budget_bytes // slot))
            for keys, values in like or []:
                self.keys.append(keys.new_zeros((rows, keys.shape[1], columns, keys.shape[3])))
                self.values.append(values.new_zeros((rows, values.shape[1], columns, values.shape[3])))
            return
        for bufs in (self.keys, self.values):
            for layer, old in enumerate(bufs):
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[: self.rows, :, :used] = old[: self.rows, :, :used]
                bufs[layer] = new

    def _compact(self) -> None:
        """Drop leading columns no live row uses once they are most of the buffer (keeps steps cheap)."""
        if not self.rows:  # drained: let the buffers go (the next row sizes new ones to what it needs)
            self.seen, self.starts, self.groups, self.row_groups, self.alone = 0, [], [], [], []
            self._unbind()
            self.keys, self.values = [], []
            self.mask = self.mask.new_zeros((0, 0))
            return
        cut = min(self.starts)
        if cut < self.compact_from or cut * 2 < self.seen:
            return
        self._shift(-cut)

    def _shift(self, by: int) -> None:
        """Move every live row's columns `by` to the right (negative: to the left), growing the buffers
        when needed; the columns left behind are masked (their stale keys/values get no weight)."""
        if by > 0:
            self._reserve(self.rows, self.seen + by)
        source, target = slice(max(-by, 0), self.seen), slice(max(by, 0), self.seen + by)
        for buf in (*self.keys, *self.values):
            buf[: self.rows, :, target] = buf[: self.rows, :, source].clone()
        self.mask[: self.rows, target] = self.mask[: self.rows, source].clone()
        vacated = slice(0, by) if by > 0 else slice(self.seen + by, self.seen)
        self.mask[: self.rows, vacated] = 0
        self.seen += by
        self.starts = [s + by for s in self.starts]

    def _unbind(self) -> None:
        for layer in getattr(self.cache, "layers", []):
            if hasattr(layer, "bind"):
                layer.keys = layer.values = layer.key_buf = layer.value_buf = None

    def _bind(self, rows: int | None = None) -> None:
        """Point the cache's layers at the live rows' columns (`rows`: and filler rows after them)."""
        layer_type = preallocated_layer()
        for index, (keys, values) in enumerate(zip(self.keys, self.values)):
            layer = self.cache.layers[index]
            if not isinstance(layer, layer_type):
                layer = self.cache.layers[index] = layer_type()
            layer.bind(keys, values, self.rows if rows is None else rows, self.seen)

    def start_alone(self, cache: Cache, length: int) -> None:
        """One row with the library's own cache object (models whose layers are not all plain)."""
        self.cache = cache
        self.mask = torch.ones((1, length), dtype=torch.long, device=self.device)
        self.rows, self.seen = 1, length
