"""A model answering conversations through its chat template: streamed (chat.py) or in batches
(evaluate.py --exact-match, judge.py), prompts rendered exactly as training rendered them.

    bot = Assistant.load(Path("runs/tiny-instruct"))            # a run dir or a checkpoint
    for piece in bot.stream([{"role": "user", "content": "Add 2 and 3."}], Sampling()):
        print(piece, end="", flush=True)
    answers = bot.answer_all([conversation, ...], Sampling(), batch_size=16)

An answer ends at the template's end (one token, or the ids of a longer end), at end-of-text, at
max_new_tokens, or when the context is full. Text is decoded from the whole answer so far, so a
character split over several tokens appears once it is complete.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxgpt.data.chat_template import ChatTemplate, TemplateError, read_template
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.model.sampling import generate_batch, stream

REPLACEMENT = "\ufffd"  # what decoding gives for the bytes of a character not yet complete


@dataclass(frozen=True)
class Sampling:
    """How answers are drawn (sampling.sample_next): temperature 0 is greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


class Assistant:
    """A model, its tokenizer and its chat template."""

    def __init__(self, model: Any, tok: Tokenizer, template: ChatTemplate, where: str = "") -> None:
        template.check(tok)
        self.model, self.tok, self.template, self.where = model, tok, template, where
        self.context = model.cfg.context_length
        self.stops = template.stop_ids(tok)
        self.end = template.end_ids(tok)

    @classmethod
    def load(cls, path: Path, template: ChatTemplate | None = None) -> Assistant:
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
        return cls(model, tok, template or saved, str(ckpt))

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
            raise TemplateError(f"the prompt is {len(ids):,} tokens; the model's context is {self.context:,}")
        return ids, dropped

    def _cut(self, ids: list[int]) -> list[int]:
        """An answer's ids without a (multi-token) end and what follows it."""
        n = len(self.end)
        for i in range(len(ids) - n + 1):
            if ids[i : i + n] == self.end:
                return ids[:i]
        return ids

    def stream(self, messages: Sequence[Mapping[str, Any]], sampling: Sampling) -> Iterator[str]:
        """The answer to the last user message, as text pieces while it is generated."""
        room = min(sampling.max_new_tokens, self.context // 2)
        prompt, _ = self.prompt(messages, room)
        ids: list[int] = []
        shown = ""
        for (token,) in stream(
            self.model,
            [prompt],
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=sampling.seed,
            eot_id=self.stops,
            n_vocab=self.tok.n_vocab,
            on_full="stop",
        ):
            ids.append(token)
            kept = self._cut(ids)
            if len(kept) < len(ids):
                break
            # Hold back a possible start of the end's ids, and an unfinished character.
            tail = next((k for k in range(min(len(self.end) - 1, len(ids)), 0, -1) if ids[-k:] == self.end[:k]), 0)
            text = self.tok.decode(ids[: len(ids) - tail]).rstrip(REPLACEMENT)
            if len(text) > len(shown) and text.startswith(shown):
                yield text[len(shown) :]
                shown = text
        final = self.tok.decode(self._cut(ids))
        if final.startswith(shown) and len(final) > len(shown):
            yield final[len(shown) :]

    def answer(self, messages: Sequence[Mapping[str, Any]], sampling: Sampling) -> str:
        return "".join(self.stream(messages, sampling))

    def answer_all(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], sampling: Sampling, batch_size: int = 16
    ) -> list[str]:
        """Answers to many conversations (each ending with a user message), decoded in batches; each
        answer is the one the same conversation alone would get (every row its own seed's draws)."""
        out: list[str] = []
        room = min(sampling.max_new_tokens, self.context // 2)
        for lo in range(0, len(conversations), batch_size):
            batch = conversations[lo : lo + batch_size]
            prompts = [self.prompt(c, room)[0] for c in batch]
            new = generate_batch(
                self.model,
                prompts,
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                seed=[sampling.seed] * len(batch),
                eot_id=self.stops,
                n_vocab=self.tok.n_vocab,
                on_full="stop",
            )
            out.extend(self.tok.decode(self._cut(ids)) for ids in new)
        return out
