"""Scores over a task's examples: pass@1 and pass@k, the centred accuracy, ChatCORE, the report table.

    r = pass_at_k([[True, False], [False, False]])    # {"examples": 2, "k": 2, "pass@1": 0.25, "pass@k": 0.5}
    chat_core({"gsm8k": (0.10, 0.0), "mmlu": (0.40, 0.25)})   # (0.10 + 0.20) / 2 = 0.15
    print("\\n".join(report_lines({"gsm8k": (outcomes, 0.0), "mmlu": (mc_outcomes, 0.25)})))

pass@1: the mean over every sample of every example (the expectation of nanochat's first-sample
count); pass@k: the share of examples with a right sample among their k. ChatCORE (nanochat's
scripts/chat_eval.py): the mean over tasks of (pass@1 - baseline) / (1 - baseline), the baseline
being chance (0.25 for 4 choices, 0 for generative tasks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def pass_at_k(outcomes: Sequence[Sequence[bool]]) -> dict[str, float | int]:
    """{"examples", "k", "pass@1", "pass@k"} from each example's k outcomes (the same k for all)."""
    if not outcomes:
        raise ValueError("pass_at_k: no examples")
    k = len(outcomes[0])
    if k < 1 or any(len(row) != k for row in outcomes):
        counts = sorted({len(row) for row in outcomes})
        raise ValueError(f"pass_at_k: every example needs the same number (>= 1) of samples, got {counts}")
    n = len(outcomes)
    return {
        "examples": n,
        "k": k,
        "pass@1": sum(sum(map(bool, row)) for row in outcomes) / (n * k),
        "pass@k": sum(any(row) for row in outcomes) / n,
    }


def centred(accuracy: float, baseline: float) -> float:
    """(accuracy - baseline) / (1 - baseline): 0 at chance, 1 when every answer is right."""
    if not 0.0 <= baseline < 1.0:
        raise ValueError(f"baseline must be in [0, 1), got {baseline!r}")
    return (accuracy - baseline) / (1.0 - baseline)


def chat_core(results: Mapping[str, tuple[float, float]]) -> float:
    """nanochat's ChatCORE: the mean over tasks of the centred accuracy, from {task: (accuracy, baseline)}."""
    if not results:
        raise ValueError("chat_core: no tasks")
    return sum(centred(acc, base) for acc, base in results.values()) / len(results)


def report_lines(results: Mapping[str, tuple[Sequence[Sequence[bool]], float]]) -> list[str]:
    """The table, one row per task from {task: (outcomes per example, baseline)}: examples, pass@1,
    pass@k (a column only if some task has k > 1; "-" where k is 1), centred pass@1; then ChatCORE."""
    scores = {name: pass_at_k(outcomes) for name, (outcomes, _base) in results.items()}
    sampled = any(s["k"] > 1 for s in scores.values())
    width = max([len("ChatCORE"), *map(len, results)])
    head = f"{'task':<{width}}  {'examples':>8}  {'pass@1':>7}" + (f"  {'k':>3}  {'pass@k':>7}" if sampled else "")
    lines = [head + f"  {'centred':>7}"]
    for name, s in scores.items():
        row = f"{name:<{width}}  {s['examples']:>8,}  {s['pass@1']:>7.4f}"
        if sampled:
            row += f"  {s['k']:>3}  {s['pass@k']:>7.4f}" if s["k"] > 1 else f"  {s['k']:>3}  {'-':>7}"
        lines.append(row + f"  {centred(s['pass@1'], results[name][1]):>7.4f}")
    core = chat_core({name: (s["pass@1"], results[name][1]) for name, s in scores.items()})
    lines.append(f"{'ChatCORE':<{len(lines[0]) - 7}}{core:>7.4f}")
    return lines
