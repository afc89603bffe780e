"""Answers scored by a larger model: the evaluation of Raschka's "Build a Large Language Model (From
Scratch)", chapter 7, against any OpenAI-compatible chat endpoint (judge.py).

    judge = Judge(url="https://api.openai.com/v1", model="gpt-4o-mini", api_key=os.environ["OPENAI_API_KEY"])
    verdict = judge.score(instruction, reference, answer)   # Verdict(score=85, reply="85", error=None)

The rubric is the book's prompt (RUBRIC): the instruction as the model saw it, the reference
answer, the model's answer, "on a scale from 0 to 100, where 100 is the best score. Respond with
the integer number only." The score is the first whole number 0..100 in the reply; a reply without
one is kept, its score None (counted and shown, never dropped). Each request has a timeout and
at most `retries` retries (the openai client's own backoff, on timeouts, connection errors, 408,
409, 429 and 5xx); a request that still fails is recorded with its error, score None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RUBRIC = (
    "Given the input `{instruction}` and correct output `{reference}`, score the model response "
    "`{answer}` on a scale from 0 to 100, where 100 is the best score. Respond with the integer number only."
)
PROBE = "Reply with the number 100 and nothing else."  # judge.py's first request: is the endpoint there?
_NUMBER = re.compile(r"(?<![\d.])(\d{1,3})(?![\d.])")


@dataclass(frozen=True)
class Verdict:
    score: int | None  # None: no number in the reply, or the request failed
    reply: str | None  # the judge's raw reply (None: it never answered)
    error: str | None = None  # why the request failed, after its retries


def parse_score(reply: str) -> int | None:
    """The first whole number 0..100 standing on its own in the reply (not part of 12.5 or 2024)."""
    for m in _NUMBER.finditer(reply):
        value = int(m.group(1))
        if value <= 100:
            return value
    return None


class Judge:
    """One OpenAI-compatible chat endpoint asked to score answers, temperature 0."""

    def __init__(self, url: str, model: str, api_key: str, *, timeout: float = 60.0, retries: int = 2) -> None:
        import openai  # imported here: nothing else of the project needs it

        self.model = model
        self._errors = (openai.APIError, openai.APIConnectionError, openai.APITimeoutError)
        self.client = openai.OpenAI(base_url=url, api_key=api_key, timeout=timeout, max_retries=retries)

    def score(self, instruction: str, reference: str, answer: str) -> Verdict:
        prompt = RUBRIC.format(instruction=instruction, reference=reference, answer=answer)
        try:
            reply = self._ask(prompt)
        except self._errors as e:
            return Verdict(None, None, _why(e))
        return Verdict(parse_score(reply), reply)

    def probe(self) -> str | None:
        """One request before any answer is drawn (with the same timeout and retries): None when the
        endpoint answered, whatever it said; else why it did not, in one line."""
        try:
            self._ask(PROBE)
        except self._errors as e:
            return _why(e)
        return None

    def _ask(self, prompt: str) -> str:
        out = self.client.chat.completions.create(
            model=self.model, temperature=0.0, messages=[{"role": "user", "content": prompt}]
        )
        return (out.choices[0].message.content or "") if out.choices else ""


def _why(e: Exception) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {first[:200]}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over the scored answers, and how many were not scored (no number; a failed request)."""
    scores = [r["score"] for r in rows if r["score"] is not None]
    return {
        "examples": len(rows),
        "scored": len(scores),
        "mean": sum(scores) / len(scores) if scores else None,
        "unparseable": sum(r["score"] is None and r["error"] is None for r in rows),
        "failed": sum(r["error"] is not None for r in rows),
    }
