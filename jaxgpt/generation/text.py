"""An answer's text as its tokens arrive: what is certain so far, where it stops, each token's offset.

    text = TextStream(tok, stop=["\\n\\n"], end=template.end_ids(tok))
    for token in tokens:
        piece = text.push(token)        # "" while what comes may still change (see below)
        if text.stopped:
            break
    piece = text.finish()               # the rest, once the answer ends another way

What may still change is held back: an unfinished character at the end (a last U+FFFD), an ending
that could start a stop string, and ids that could start a multi-token `end` (a chat template's
end that is not one token). A stop string cuts the text before it; `end` cuts the answer before
its ids. Joining every piece gives exactly the answer's final text, streamed or whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxgpt.data.tokenizer import EOT_TEXT, Tokenizer

REPLACEMENT = "\ufffd"  # what decoding gives for the bytes of a character not yet complete


class TextStream:
    """One answer's text, pushed a token at a time (see the module's docstring)."""

    def __init__(self, tok: Tokenizer | None, stop: Sequence[str] = (), end: Sequence[int] = ()) -> None:
        if tok is None and (stop or len(end) > 1):
            raise ValueError("stop strings and a multi-token end need a tokenizer (the text of the answer)")
        self.tok = tok  # None: ids only, no text (an engine without a tokenizer)
        self.stop = tuple(s for s in stop if s)
        self.end = list(end) if len(end) > 1 else []  # a one-token end is a stop id: the engine's
        self.ids: list[int] = []
        self.offsets: list[int] = []  # each token's first character in the answer's text
        self.text = ""  # the whole answer decoded so far
        self.sent = 0  # characters of it handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; returns the text that became certain (maybe ""). Sets `stopped` when a
        stop string or the end completes: the answer is then final."""
        self.offsets.append(len(self.text))
        self.ids.append(token)
        if self.tok is None:
            return ""
        if self.end and self.ids[-len(self.end) :] == self.end:
            return self._final(self.tok.decode(self.ids[: -len(self.end)]))
        self.text = self.tok.decode(self.ids)
        found = [i for i in (self.text.find(s, self.sent) for s in self.stop) if i >= 0]
        if found:
            return self._final(self.text[: min(found)])
        return self._take(self._certain())

    def finish(self) -> str:
        """The answer ended (its length, a stop id, the context): the text not handed out yet."""
        return "" if self.stopped else self._take(len(self.text))

    @property
    def kept(self) -> int:
        """Tokens that belong to the answer: all of them, or when a stop string or the end cut it,
        those that start before the cut (the logprobs a response lists)."""
        return sum(1 for offset in self.offsets if offset < len(self.text)) if self.stopped else len(self.ids)

    def _certain(self) -> int:
        """How much of the text cannot change whatever comes next."""
        safe = len(self.text) - self.text.endswith(REPLACEMENT)
        held = 0
        for s in self.stop:  # the longest ending that could begin a stop string
            held = max(
                held, next((k for k in range(min(len(s) - 1, safe), 0, -1) if self.text[safe - k : safe] == s[:k]), 0)
            )
        safe -= held
        tail = next(
            (k for k in range(min(len(self.end) - 1, len(self.ids)), 0, -1) if self.ids[-k:] == self.end[:k]), 0
        )
        if tail:
            safe = min(safe, len(self.tok.decode(self.ids[:-tail])))
        return safe

    def _take(self, upto: int) -> str:
        piece = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return piece

    def _final(self, text: str) -> str:
        self.stopped, self.text = True, text
        return self._take(len(text))


def token_text(tok: Tokenizer, token: int) -> str:
    """One token as text, as the logprobs of a response name it (special tokens by their name; a
    part of a character is U+FFFD)."""
    return EOT_TEXT if token == tok.eot_id else tok.decode([token])


def token_bytes(tok: Tokenizer, token: int) -> bytes:
    """The bytes a token stands for (chat logprobs' `bytes`: a part of a character is its own bytes,
    not U+FFFD's); end-of-text and the other special tokens: their names' bytes."""
    if tok.name == "bytes":
        return EOT_TEXT.encode() if token == tok.eot_id else bytes([token])
    if tok.name == "gpt2" and token != tok.eot_id:
        import tiktoken  # the tokenizer has loaded the encoding already: a registry lookup

        return tiktoken.get_encoding("gpt2").decode_single_token_bytes(token)
    return token_text(tok, token).encode("utf-8")  # a trained tokenizer: exact for whole-character tokens
