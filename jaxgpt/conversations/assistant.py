"""A model answering conversations through its chat template, on the generation engine: streamed
(chat.py) or many at once (evaluate.py, judge.py, RL), prompts rendered exactly as in training.

    bot = Assistant.load(Path("runs/tiny-instruct"))            # a run dir or a checkpoint
    for piece in bot.stream([{"role": "user", "content": "Add 2 and 3."}], SamplingParams(temperature=0)):
        print(piece, end="", flush=True)
    answers = bot.answer_all([conversation, ...], SamplingParams(temperature=0, max_tokens=64))

An answer ends at the template's end, at end-of-text, at max_tokens, or when the context is full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxgpt.conversations.template import ChatTemplate, TemplateError, read_template
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.generation.engine import Engine, Request
from jaxgpt.generation.sampling import SamplingParams


class Assistant:
    """A model's engine, its tokenizer and its chat template."""

    def __init__(
        self, model: Any, tok: Tokenizer, template: ChatTemplate, where: str = "", *, rows: int = 1, mesh: Any = None
    ) -> None:
        template.check(tok)
        self.tok, self.template, self.where = tok, template, where
        self.engine = Engine(model, tok, rows=rows, mesh=mesh)
        self.context = model.cfg.context_length
        end = template.end_ids(tok)
        self._ends = {"stop_ids": frozenset(template.stop_ids(tok)), "end": tuple(end) if len(end) > 1 else ()}

    @classmethod
    def load(cls, path: Path, template: ChatTemplate | None = None, *, rows: int = 1) -> Assistant:
        """From a checkpoint folder, link or run dir; `template` overrides (or supplies, for a base
        model) the checkpoint's own. TemplateError when there is neither."""
        from jaxgpt.checkpoints.store import load_model  # JAX: imported only when a model is loaded

        model, _cfg, tok, ckpt = load_model(path)
        saved = read_template(ckpt)
        if template is None and saved is None:
            raise TemplateError(
                f"{ckpt}: a base model (no chat template: it was not fine-tuned on conversations); "
                f"fine-tune it on a conversation dataset, or ask for raw text (--raw)"
            )
        return cls(model, tok, template or saved, str(ckpt), rows=rows)

    def prompt(self, messages: Sequence[Mapping[str, Any]], room: int) -> tuple[list[int], int]:
        """The prompt ids of a conversation ending with a user message, leaving `room` tokens for the
        answer: the oldest turns are left out until it fits. Returns (ids, turns left out)."""
        messages = list(messages)
        system = messages[:1] if messages and messages[0].get("role") == "system" else []
        body = messages[len(system) :]
        dropped = 0
        while True:
            ids = self.template.prompt(self.tok, system + body)
            if len(ids) + room <= self.context or len(body) <= 1:
                break
            body, dropped = body[2:], dropped + 1  # one user turn and its answer
        if len(ids) >= self.context:
            raise TemplateError(
                f"the last message makes a prompt of {len(ids):,} tokens; the model's context is {self.context:,}"
            )
        return ids, dropped

    def params(self, params: SamplingParams, **changes: Any) -> SamplingParams:
        """`params` ending where the template's answers end, inside the context (and `changes`)."""
        return dataclasses.replace(params, on_full="stop", **self._ends, **changes)

    def _prompt(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams) -> list[int]:
        return self.prompt(messages, min(params.max_tokens, self.context // 2))[0]

    def render(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams) -> list[int] | None:
        """The prompt ids, or None when the conversation leaves no room for an answer in the context."""
        try:
            return self._prompt(messages, params)
        except TemplateError:
            return None

    def stream(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams) -> Iterator[str]:
        """The answer to the last user message, as text pieces while it is drawn."""
        return self.engine.stream(self._prompt(messages, params), self.params(params))

    def answer(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams) -> str:
        return "".join(self.stream(messages, params))

    def requests(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], params: SamplingParams, n: int = 1
    ) -> list[Request]:
        """n answers to each conversation (each ending with a user message), drawn together in the
        engine's rows, in conversation order; answer i of a conversation draws with seed + i."""
        prompts = [self._prompt(c, params) for c in conversations]
        return self.engine.generate(prompts, self.params(params), n)

    def answer_all(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], params: SamplingParams, n: int = 1
    ) -> list[str]:
        """The texts of `requests`: each answer the one the same conversation alone would get."""
        return [r.text.text for r in self.requests(conversations, params, n)]
