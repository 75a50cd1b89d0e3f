"""A judge's reward (`judge:MODEL`): a language model reads a group of runs of one task side by side and
scores each against a rubric, relative to the others (OpenPipe ART's RULER). GRPO needs only the order
within a group, which a judge comparing attempts gives more steadily than one scoring each alone.

Two kinds of judge:
- **a local model** through the project's own transformers backend (`judge:embedded`, a Hugging Face id
  or folder): asked "how good is attempt N? one digit", each attempt's verdict is the model's
  distribution over the digits 0-9 as its answer begins, read as the expected digit / 9, and the group
  read twice, in its order and reversed, each verdict the mean of the two (small models favour a
  place). It is always a number in [0, 1], whatever the model would have written, and says how sure the
  judge is (`details["p"]`);
- **any LangChain chat model** (`judge:openai:gpt-4.1-mini`, an `init_chat_model` id, or a chat model
  object in Python): asked for JSON, one score in [0, 1] per attempt, checked; a reply that is not that
  is asked again once, then the group is unscored (None, with the reason), never a made-up number.

The rubric is a text file the user can edit (`--rubric`; `judge_rubric.md` by default). A run's verdict
records the judge, the rubric's digest and the attempt's place in the group, saved with the run.
What a run holds (its task, calls, replies, answer) is untrusted text shown to the judge: it can sway a
verdict, which is a training signal only; it never reaches a gate or a terminal through this module.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp.errors import UserError
from envace_mcp.policy.prompts import content_text
from envace_mcp.toolbox.result import NOT_THE_SERVERS, ToolResult
from envace_mcp.traces.schema import STOPPED, Trace

if TYPE_CHECKING:
    from envace_mcp.policy.transformers import TransformersPolicy

Verdict = tuple[float | None, dict[str, Any]]

DEFAULT_RUBRIC = Path(__file__).with_name("judge_rubric.md")
SCALE = 9
"""Scores are the digits 0..SCALE (one token each in every tokenizer we know), divided by SCALE."""
ATTEMPT_CHARS = 2400
"""An attempt's text is cut to this many characters (halved while the group does not fit the context)."""
REPLY_CHARS, ARGUMENT_CHARS, ANSWER_CHARS = 300, 200, 600


# ---------------------------------------------------------------------------------------------- prompts

def attempt_text(trace: Trace, limit: int = ATTEMPT_CHARS) -> str:
    """One run as the judge reads it: each call with its arguments and what came of it (the reply, an
    error, a stop by the gate, a person's refusal), unreadable calls counted, and the final answer."""
    lines: list[str] = []
    unreadable = 0
    for step in trace.steps:
        if step.role == "act":
            unreadable += sum(1 for issue in (step.parsed or {}).get("issues") or []
                              if isinstance(issue, dict) and issue.get("code") == "invalid_tool_call")
        if step.role != "tool":
            continue
        args = _cut(json.dumps(step.arguments, ensure_ascii=False, default=str), ARGUMENT_CHARS)
        lines.append(f"{len(lines) + 1}. {step.tool} {args} -> {_outcome(step)}")
    if unreadable:
        lines.append(f"({unreadable} tool call{'s' if unreadable > 1 else ''} the agent wrote could not be read)")
    answer = (trace.final_answer or "").strip()
    end = f"Final answer: {_cut(answer, ANSWER_CHARS)}" if answer else "No final answer."
    reason = trace.metadata.get("stop_reason")
    if not answer and isinstance(reason, str):
        end += f" ({_cut(reason, 160)})"
    body = "\n".join(lines) if lines else "No calls."
    room = max(limit - len(end) - 1, 0)
    return f"{_cut(body, room)}\n{end}"


def _outcome(step: Any) -> str:
    if step.decision == "rejected_by_human":
        return "not run: the person refused it"
    if step.decision in STOPPED:
        return f"not run: stopped by the gate ({step.decision})"
    if step.simulated or step.decision == "simulate":
        return "not run: answered by a rehearsal"
    result = step.result or {}
    structured = result.get("structured_content")
    text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"), default=str) if structured is not None \
        else ToolResult.text_of(result)
    if result.get("is_error"):
        who = "refused by the toolbox" if result.get("error_kind") in NOT_THE_SERVERS else "error"
        return f"{who}: {_cut(text, REPLY_CHARS)}"
    return _cut(text, REPLY_CHARS)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split()) if "\n" in text and len(text) > limit else text
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def judge_chat(traces: Sequence[Trace], rubric: str, limit: int = ATTEMPT_CHARS, *,
               ask: str | None = None) -> list[dict[str, str]]:
    """The judge's chat for a group: the rubric as the system message; the task, the rules the agent
    worked under, and every attempt in the user message."""
    first = traces[0]
    rules = first.metadata.get("instructions")
    parts = [f"## Task\n{first.task or '(not recorded)'}"]
    if isinstance(rules, str) and rules.strip():
        parts.append(f"## Rules the agent works under\n{rules.strip()}")
    parts += [f"## Attempt {i}\n{attempt_text(trace, limit)}" for i, trace in enumerate(traces, 1)]
    parts.append(ask or f"Score each attempt from 0 (worst) to {SCALE} (best), comparing them with each other.")
    return [{"role": "system", "content": rubric.strip()}, {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------------------------------- judges

class LocalJudge:
    """A transformers model as judge: for each attempt, the group's chat ending with the question "how
    good is attempt N? one digit", and the verdict is the model's next-token distribution over the digits
    as its answer begins. The attempts' chats share everything up to the question, run once."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy = policy
        self._digits: list[int] | None = None

    @staticmethod
    def ask(attempt: int) -> str:
        return (f"How good is attempt {attempt}, compared with the others? Answer with one digit from 0 (worst) "
                f"to {SCALE} (best).")

    def _digit_ids(self, text: str, ids: list[int]) -> list[int]:
        """The token each digit is written as where the answer begins ("7", else " 7")."""
        if self._digits is None:
            for space in ("", " "):
                each = [self.policy.encode(f"{text}{space}{d}") for d in range(SCALE + 1)]
                if all(len(e) == len(ids) + 1 and e[: len(ids)] == ids for e in each):
                    self._digits = [e[-1] for e in each]
                    break
            else:
                raise UserError(f"judge {self.policy.name}: its tokenizer does not write the digits 0-{SCALE} as "
                                "single tokens, which a local judge's verdict is read from")
        return self._digits

    def score(self, traces: Sequence[Trace], rubric: str) -> list[Verdict]:
        """Each attempt read in the group's order and in reverse, its verdict the mean of the two: a small
        model scores by position first (the embedded one rose with N in every group), which the two
        orders cancel."""
        n = len(traces)
        forward = self._read(traces, rubric)
        backward = self._read(list(reversed(traces)), rubric) if forward is not None and n > 1 else forward
        if forward is None or backward is None:
            return [(None, {"unscorable": f"the group's {n} runs do not fit the judge's context"})] * n
        verdicts = []
        for i, ((a, p, mass), (b, q, mass_b)) in enumerate(zip(forward, reversed(backward)), 1):
            verdicts.append(((a + b) / 2, {"attempt": i, "of": n, "readings": [round(a, 4), round(b, 4)],
                                           "p": [round((x + y) / 2, 4) for x, y in zip(p, q)],
                                           "digit_mass": round((mass + mass_b) / 2, 4)}))
        return verdicts

    def _read(self, traces: Sequence[Trace], rubric: str) -> list[tuple[float, list[float], float]] | None:
        """(expected digit / SCALE, the digits' distribution, the mass on digits) per attempt, in order."""
        context = getattr(self.policy, "context_window", None) or 2048
        limit = ATTEMPT_CHARS
        for _ in range(4):
            texts = [self.policy.render(judge_chat(traces, rubric, limit, ask=self.ask(i)), None)
                     for i in range(1, len(traces) + 1)]
            ids = [self.policy.encode(text) for text in texts]
            if max(map(len, ids)) + 1 <= context:
                break
            limit //= 2
        else:
            return None
        digits = self._digit_ids(texts[0], ids[0])
        shared = next((k for k, column in enumerate(zip(*ids)) if len(set(column)) > 1), min(map(len, ids)))
        shared = min(shared, min(map(len, ids)) - 1)  # every attempt keeps a token of its own to predict from
        out = []
        for logprobs in self.policy.engine.next_token_logprobs(ids[0][:shared], [i[shared:] for i in ids], digits):
            weights = [math.exp(lp) for lp in logprobs]
            mass = sum(weights)
            p = [w / mass for w in weights]
            out.append((sum(d * q for d, q in enumerate(p)) / SCALE, p, mass))
        return out


class ChatJudge:
    """A LangChain chat model as judge: one call per group asking for JSON scores, checked, asked again
    once when the reply is not one score in [0, 1] for each attempt."""

    ASK = ("Reply with JSON only, no other text: {\"scores\": [{\"attempt\": 1, \"why\": \"<one sentence>\", "
           "\"score\": <a number from 0 to 1>}, ...]}, one entry for each of the {n} attempts.")

    def __init__(self, model: Any) -> None:
        self.model = model

    def score(self, traces: Sequence[Trace], rubric: str) -> list[Verdict]:
        ask = self.ASK.replace("{n}", str(len(traces)))
        chat = judge_chat(traces, rubric, ask=f"Score each attempt from 0 (worst) to 1 (best), comparing them with "
                                              f"each other. {ask}")
        messages: list[Any] = [(m["role"], m["content"]) for m in chat]
        problem = ""
        for _ in range(2):
            answer = self.model.invoke(messages)
            reply = content_text(getattr(answer, "content", answer))
            try:
                scores = read_scores(reply, len(traces))
            except ValueError as exc:
                problem = str(exc)
                messages += [("ai", reply), ("human", f"That reply could not be used: {problem} {ask}")]
                continue
            return [(score, {"attempt": i, "of": len(traces), "why": _cut(why, 300)})
                    for i, (score, why) in enumerate(scores, 1)]
        why = f"the judge's reply could not be read, twice: {problem}"
        return [(None, {"unscorable": why}) for _ in traces]


def read_scores(reply: str, n: int) -> list[tuple[float, str]]:
    """`(score, why)` for attempts 1..n from a chat judge's reply: a JSON object (a code fence or text
    around it is tolerated) whose `scores` hold each attempt once, with a finite score in [0, 1]."""
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in it.")
    try:
        data = json.loads(reply[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"its JSON is broken ({exc.msg}).") from None
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("it has no list 'scores'.")
    found: dict[int, tuple[float, str]] = {}
    for entry in entries:
        attempt = entry.get("attempt") if isinstance(entry, dict) else None
        score = entry.get("score") if isinstance(entry, dict) else None
        if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= n or attempt in found:
            raise ValueError(f"an entry names attempt {str(attempt)[:20]!r}: each of 1..{n} must appear once.")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) or not 0 <= score <= 1:
            raise ValueError(f"attempt {attempt}'s score {str(score)[:20]!r} is not a number from 0 to 1.")
        why = entry.get("why")
        found[attempt] = (float(score), why if isinstance(why, str) else "")
    if len(found) != n:
        raise ValueError(f"it scores {len(found)} of the {n} attempts.")
    return [found[i] for i in range(1, n + 1)]


@dataclass
class Judge:
    """The `judge:MODEL` reward (named `judge:MODEL#<rubric digest>` under a rubric of the user's own, so
    runs scored under another rubric are scored again). `score_group(runs)` scores one group together;
    `judge(trace, state)` scores a run alone (a group of one), as `record_run(rewards=)` calls it.
    The model loads on the first group that needs it; `release()` lets it go."""

    name: str
    rubric: str
    load: Callable[[], LocalJudge | ChatJudge] = field(repr=False)
    _scorer: LocalJudge | ChatJudge | None = field(default=None, repr=False)

    @property
    def rubric_digest(self) -> str:
        return _digest(self.rubric)

    def score_group(self, traces: Sequence[Trace]) -> list[Verdict]:
        verdicts: list[Verdict] = [(None, {"unscorable": f"the run is {t.status}, not finished"}) for t in traces]
        finished = [i for i, t in enumerate(traces) if t.status == "finished"]
        if finished:
            if self._scorer is None:
                self._scorer = self.load()
            for i, (value, details) in zip(finished, self._scorer.score([traces[i] for i in finished], self.rubric)):
                verdicts[i] = (value, {"judge": self.name, "rubric": self.rubric_digest, **details})
        return verdicts

    def __call__(self, trace: Trace, final_state: Mapping[str, Any] | None = None) -> Verdict:
        return self.score_group([trace])[0]

    def release(self) -> None:
        self._scorer = None


def judge(model: str | Any, *, rubric: str | Path | None = None) -> Judge:
    """`judge("embedded")`, `judge("Qwen/Qwen3-1.7B")`, `judge("./my-model")`: a local model on the
    transformers backend; `judge("openai:gpt-4.1-mini")`: an `init_chat_model` id (needs `langchain` and the
    provider's package); or a LangChain chat model object. `rubric`: a text file; default `judge_rubric.md`."""
    default = DEFAULT_RUBRIC.read_text(encoding="utf-8")
    text = default if rubric is None else _rubric(rubric)
    own = "" if text == default else f"#{_digest(text)}"  # another rubric, another reward: scored anew
    if not isinstance(model, str):
        label = getattr(model, "model_name", None) or getattr(model, "model", None) or type(model).__name__
        return Judge(f"judge:{label}{own}", text, lambda: ChatJudge(model))
    if not model.strip():
        raise UserError("judge: name a model, e.g. judge:embedded or judge:openai:gpt-4.1-mini")
    if model == "embedded" or Path(model).exists() or ":" not in model:
        return Judge(f"judge:{model}{own}", text, lambda: LocalJudge(_local(model)))
    return Judge(f"judge:{model}{own}", text, lambda: ChatJudge(_chat(model)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _rubric(rubric: str | Path) -> str:
    try:
        text = Path(rubric).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"rubric {str(rubric)[:200]!r}: {type(exc).__name__}: {exc}"[:400]) from None
    if not text.strip():
        raise UserError("the judge's rubric is empty")
    return text


def _local(model: str) -> Any:
    from envace_mcp.policy.transformers import TransformersPolicy

    return TransformersPolicy.from_pretrained(None if model == "embedded" else model, adapter=None)


def _chat(model: str) -> Any:
    try:
        from langchain.chat_models import init_chat_model
    except ImportError:
        raise UserError(f"judge:{model}: a chat model judge needs LangChain: pip install 'envace-mcp[langchain]' and "
                        "the provider's package (e.g. langchain-openai)") from None
    try:
        return init_chat_model(model)
    except Exception as exc:  # noqa: BLE001 - an unknown provider, a missing package or key: one line
        raise UserError(f"judge:{model}: {type(exc).__name__}: {exc}"[:400]) from None
