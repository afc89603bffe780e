"""Reward rules: whether an answer is right, 1.0 or 0.0, by a stated normalisation.

    rule = reward_rule("last_number", "train.json: reward")    # or "exact", "exact_nocase",
    rule("So she makes $1,234.", "1234")                        # {"rule": "regex", "pattern": "..."}
    rule.describe()                                             # one line: what is compared, after what

Each rule is a frozen dataclass called as rule(answer, reference); check(reference) raises a
ValueError for a reference the rule can never match (a reader turns it into a TaskError naming the
file and line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from jaxgpt.tasks.base import Reward, TaskError

__all__ = ["ExactMatch", "LastNumber", "Regex", "Reward", "RewardError", "reward_rule", "normalise", "last_number"]

# A number: an optional sign (not after a letter, digit or closing bracket: "5-3" holds 5 and 3), digits
# with optional thousands commas ("1,234"), an optional decimal part. Never starts inside a number.
_NUMBER = re.compile(r"(?:(?<![\w)\]])([-+]))?(?<![\d.])(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?")
_RULE_NAMES = '"exact", "exact_nocase", "last_number" or {"rule": "regex", "pattern": "..."}'


class RewardError(TaskError):
    """A reward rule that cannot be built: an unknown name, a bad regular expression (one line)."""


def normalise(text: str, case_sensitive: bool = True) -> str:
    """Surrounding white space stripped, inner runs of it collapsed to one space; case-folded if asked."""
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


def _value(match: re.Match[str]) -> Decimal:
    sign, digits, decimals = match.groups()
    return Decimal((sign or "") + digits.replace(",", "") + (decimals or ""))


def last_number(text: str) -> Decimal | None:
    """The value of the last number in `text` (commas removed), or None if it holds none."""
    found = None
    for found in _NUMBER.finditer(text):
        pass
    return None if found is None else _value(found)


def _reference_number(reference: str) -> Decimal:
    match = _NUMBER.fullmatch(reference.strip())
    if match is None:
        raise ValueError(f"reference {reference!r} is not a number (as 42, -3, 1,234 or 2.5)")
    return _value(match)


@dataclass(frozen=True)
class ExactMatch:
    """Equal after normalise(): for the built-in tasks' answers (no inner white space) this is
    evaluate.py --exact-match's a.strip() == reference.strip()."""

    case_sensitive: bool = True

    def __call__(self, answer: str, reference: str) -> float:
        return float(normalise(answer, self.case_sensitive) == normalise(reference, self.case_sensitive))

    def describe(self) -> str:
        case = "" if self.case_sensitive else ", case-folded"
        return f"exact match: both stripped of surrounding white space, inner runs of it made one space{case}"

    def check(self, reference: str) -> None:
        return None


@dataclass(frozen=True)
class LastNumber:
    """The answer's last number equals the reference numerically ("3.0" is 3; commas dropped).

    nanochat's tasks/gsm8k.py compares the number after "#### " in the completion (the official
    grade-school-math extraction); this takes the last number anywhere, so a model that states the
    number without "####" still scores, and one that writes "#### 18" scores as there.
    """

    def __call__(self, answer: str, reference: str) -> float:
        found = last_number(answer)
        return float(found is not None and found == _reference_number(reference))

    def describe(self) -> str:
        return "last number: the answer's last number (sign, thousands commas, decimals) equals the reference's value"

    def check(self, reference: str) -> None:
        _reference_number(reference)


@dataclass(frozen=True)
class Regex:
    """The pattern's first match in the answer (group 1 if the pattern has a group, else the whole
    match), normalised as ExactMatch, equals the normalised reference. No match scores 0."""

    pattern: str
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_compiled", re.compile(self.pattern))
        except re.error as e:
            raise RewardError(f"bad regular expression {self.pattern!r} ({e.msg} at position {e.pos})") from None

    def __call__(self, answer: str, reference: str) -> float:
        match = self._compiled.search(answer)
        if match is None:
            return 0.0
        text = match.group(1) if self._compiled.groups else match.group(0)
        return float(text is not None and normalise(text) == normalise(reference))

    def describe(self) -> str:
        part = "its group 1" if self._compiled.groups else "the whole match"
        return f"regex: the first match of {self.pattern!r} in the answer ({part}), white space normalised, equals it"

    def check(self, reference: str) -> None:
        return None


_NAMED: dict[str, Reward] = {
    "exact": ExactMatch(),
    "exact_nocase": ExactMatch(case_sensitive=False),
    "last_number": LastNumber(),
}


def reward_rule(spec: str | dict[str, Any], where: str) -> Reward:
    """The rule a config value names: "exact", "exact_nocase", "last_number", {"rule": NAME} or
    {"rule": "regex", "pattern": "..."}; anything else is a RewardError naming `where` and the value."""
    if isinstance(spec, str) and spec in _NAMED:
        return _NAMED[spec]
    if isinstance(spec, dict) and spec.get("rule") == "regex" and set(spec) == {"rule", "pattern"}:
        if not isinstance(spec["pattern"], str) or not spec["pattern"]:
            raise RewardError(
                f"{where}: the regex rule's 'pattern' must be a non-empty string, got {spec['pattern']!r}"
            )
        try:
            return Regex(spec["pattern"])
        except RewardError as e:
            raise RewardError(f"{where}: {e}") from None
    if isinstance(spec, dict) and set(spec) == {"rule"} and spec["rule"] in _NAMED:
        return _NAMED[spec["rule"]]
    raise RewardError(f"{where}: unknown reward rule {spec!r}; expected {_RULE_NAMES}")
