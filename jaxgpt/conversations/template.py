"""Chat templates: how a conversation becomes token ids and a loss mask, the same way everywhere.

    from jaxgpt.conversations.template import template_named
    t = template_named("alpaca")                       # or ChatTemplate.from_dict(a user's template)
    ids, mask = t.render(tok, [{"role": "user", "content": "Add 2 and 3."},
                               {"role": "assistant", "content": "5"}])     # training rows
    prompt = t.prompt(tok, [{"role": "user", "content": "Add 2 and 3."}])  # what a model answers from
    stop = t.stop_ids(tok)                             # an answer ends at any of these ids

The fields and built-in templates: docs/fine-tuning.md "Chat templates". Literal parts may name
the tokenizer's special tokens (single ids); message texts are always ordinary text. `prompt` is
exactly the start of what `render` trains on, token for token. The mask is 1 on each answer and
its `end`, 0 elsewhere and on an assistant message with "weight": 0. A dataset's template is in
its manifest and in every checkpoint trained on it (TEMPLATE_FILE).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jaxgpt.data.tokenizer import EOT_TEXT, ROLE_TOKENS, SPECIAL_NAME, Tokenizer, encode_with_specials, special_tokens

TEMPLATE_FILE = "chat_template.json"  # in a checkpoint folder, beside model.json
CONTENT = "{content}"
ROLES = ("system", "user", "assistant")
ALPACA_SYSTEM = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)


class TemplateError(ValueError):
    """A template or a conversation that cannot be rendered (one line, naming where)."""


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    user: str
    assistant: str
    end: str
    system: str | None = None
    default_system: str | None = None
    bos: str | None = None
    input: str = "\n\n{content}"

    def __post_init__(self) -> None:
        where = f"chat template {self.name!r}"
        for key in ("user", "assistant", "input") + (("system",) if self.system is not None else ()):
            value = getattr(self, key)
            if not isinstance(value, str) or value.count(CONTENT) != 1:
                raise TemplateError(f"{where}: {key}={value!r} must be a string holding {CONTENT} exactly once")
        if not isinstance(self.end, str) or not self.end:
            raise TemplateError(f"{where}: end={self.end!r} must be a non-empty string (what an answer stops with)")
        for key in ("default_system", "bos"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise TemplateError(f"{where}: {key}={value!r} must be a non-empty string or null")
        if CONTENT in self.end or CONTENT in (self.bos or ""):
            raise TemplateError(f"{where}: {CONTENT} belongs in system, user and assistant only")

    # ------------------------------------------------------------------ (de)serialising

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "chat template") -> ChatTemplate:
        """A template from its JSON form; TemplateError naming `where` and the key for anything else."""
        if not isinstance(data, Mapping):
            raise TemplateError(f"{where}: expected a JSON object or a built-in name, got {data!r:.80}")
        known = {"name", "user", "assistant", "end", "system", "default_system", "bos", "input"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TemplateError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        missing = sorted({"user", "assistant", "end"} - set(data))
        if missing:
            raise TemplateError(f"{where}: missing key(s) {missing}")
        try:
            return cls(**{"name": "custom", **data})
        except TemplateError as e:
            raise TemplateError(f"{where}: {e}") from None

    # ------------------------------------------------------------------ rendering

    def check(self, tok: Tokenizer) -> None:
        """TemplateError if a literal part names a special token `tok` lacks."""
        specials = special_tokens(tok)
        for part in (self.user, self.assistant, self.end, self.system or "", self.bos or ""):
            for name in SPECIAL_NAME.findall(part):
                if name not in specials:
                    hint = (
                        " (train the tokenizer again with download_dataset.py tokenizer: it adds nanochat's role "
                        "tokens)"
                        if name in ROLE_TOKENS
                        else ""
                    )
                    raise TemplateError(
                        f"chat template {self.name!r} uses the special token {name}, which the "
                        f"{tok.name} tokenizer lacks{hint}; choose another template"
                    )

    def render(
        self, tok: Tokenizer, messages: Sequence[Mapping[str, Any]], for_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """(ids, mask) of a whole conversation (it must end with an assistant message); for_prompt:
        the messages end with a user message, followed by the assistant's opening (mask all 0)."""
        turns = check_messages(messages, for_prompt=for_prompt)
        out = _Ids(tok)
        if self.bos:
            out.literal(self.bos)
        system = turns[0]["content"] if turns and turns[0]["role"] == "system" else self.default_system
        turns = [m for m in turns if m["role"] != "system"]
        if system is not None and self.system is not None:
            self._put_message(out, self.system, system)
        for i, message in enumerate(turns):
            text = message["content"]
            if message.get("input"):  # an Alpaca record's input, after its instruction
                text += self.input.replace(CONTENT, message["input"])
            if message["role"] == "user":
                if i == 0 and system is not None and self.system is None:
                    text = f"{system}\n\n{text}"  # nanochat merges the system message into the first user turn
                self._put_message(out, self.user, text)
            else:
                before, _, after = self.assistant.partition(CONTENT)
                out.literal(before)
                out.seam(int(message.get("weight", 1)))  # an answer is a run of its own (module docstring)
                out.text(text)
                out.literal(after + self.end)
                out.seam(0)
        if for_prompt:
            out.literal(self.assistant.partition(CONTENT)[0])
        return out.close()

    @staticmethod
    def _put_message(out: _Ids, form: str, text: str) -> None:
        before, _, after = form.partition(CONTENT)
        out.literal(before)
        out.text(text)
        out.literal(after)

    def prompt(self, tok: Tokenizer, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids a model answers the last (user) message from: the conversation so far, then the
        assistant's opening."""
        return self.render(tok, messages, for_prompt=True)[0]

    def stop_ids(self, tok: Tokenizer) -> list[int]:
        """Ids that end an answer: `end` when it is one token, and end-of-text always."""
        end = encode_with_specials(tok, self.end)
        return sorted({tok.eot_id, *(end if len(end) == 1 else [])})

    def end_ids(self, tok: Tokenizer) -> list[int]:
        """`end` as ids (an answer whose generated ids end with these has ended, however long `end` is)."""
        return encode_with_specials(tok, self.end)

    def jinja(self) -> str:
        """The same template in Jinja, as transformers' tokenizer_config.json "chat_template" and
        vLLM read it (text, not ids: special tokens appear as their text)."""

        def lit(s: str) -> str:
            return json.dumps(s)

        def part(form: str, content: str) -> str:
            before, _, after = form.partition(CONTENT)
            return f"{{{{ {lit(before)} + {content} + {lit(after)} }}}}"

        sys_default = "none" if self.default_system is None else lit(self.default_system)
        before, _, after = self.input.partition(CONTENT)
        user = f"(m['content'] + ({lit(before)} + m['input'] + {lit(after)} if m.get('input') else ''))"
        merge = self.system is None
        out = [
            f"{{{{ {lit(self.bos)} }}}}" if self.bos else "",
            "{% set ns = namespace(system=" + sys_default + ") %}",
            (
                "{% if messages and messages[0]['role'] == 'system' %}{% set ns.system = messages[0]['content'] %}"
                "{% set messages = messages[1:] %}{% endif %}"
            ),
        ]
        if not merge:
            out.append("{% if ns.system is not none %}" + part(self.system, "ns.system") + "{% endif %}")
        out.append("{% for m in messages %}{% if m['role'] == 'user' %}")
        if merge:
            out.append(
                "{% if loop.first and ns.system is not none %}"
                + part(self.user, f"ns.system + '\\n\\n' + {user}")
                + "{% else %}"
                + part(self.user, user)
                + "{% endif %}"
            )
        else:
            out.append(part(self.user, user))
        out.append(
            "{% else %}" + part(self.assistant, "m['content']") + f"{{{{ {lit(self.end)} }}}}"
            "{% endif %}{% endfor %}"
        )
        out.append(
            "{% if add_generation_prompt %}" + f"{{{{ {lit(self.assistant.partition(CONTENT)[0])} }}}}{{% endif %}}"
        )
        return "".join(out)


class _Ids:
    """A conversation's ids and mask, built as transformers' apply_chat_template tokenizes its text:
    the text between special tokens encoded whole. Runs break at special tokens and at `seam`s (an
    answer's start and its end's end), so a mask is constant over a run; only template literals
    become special tokens."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.specials = tok, special_tokens(tok)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.trained, self.pending = 0, ""

    def text(self, text: str) -> None:
        self.pending += text

    def literal(self, text: str) -> None:
        for piece in SPECIAL_NAME.split(text):
            if piece in self.specials:
                self.seam(self.trained)
                self.ids.append(self.specials[piece])
                self.mask.append(self.trained)
            else:
                self.pending += piece

    def seam(self, trained: int) -> None:
        """Encode the text so far; what follows is a new run, trained on or not."""
        if self.pending:
            new = self.tok.encode(self.pending)
            self.ids.extend(new)
            self.mask.extend([self.trained] * len(new))
            self.pending = ""
        self.trained = trained

    def close(self) -> tuple[list[int], list[int]]:
        self.seam(0)
        return self.ids, self.mask


def check_messages(messages: Any, for_prompt: bool = False) -> list[dict[str, Any]]:
    """The messages as dicts, checked: an optional system message first, then user and assistant
    in turn, ending with an assistant message (for_prompt: with a user message). TemplateError otherwise."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise TemplateError(f"messages must be a non-empty list, got {messages!r:.60}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise TemplateError(f"message {i}: needs a role of {', '.join(ROLES)}, got {m!r:.60}")
        if not isinstance(m.get("content"), str):
            raise TemplateError(f"message {i} ({m['role']}): content must be a string, got {m.get('content')!r:.60}")
        if m["role"] == "assistant" and m.get("weight", 1) not in (0, 1):
            raise TemplateError(f"message {i} (assistant): weight must be 0 or 1, got {m.get('weight')!r}")
        if not isinstance(m.get("input", ""), str) or (m.get("input") and m["role"] != "user"):
            raise TemplateError(
                f"message {i} ({m['role']}): 'input' is an Alpaca instruction's input: a string, "
                f"on a user message, got {m.get('input')!r:.60}"
            )
        out.append(dict(m))
    body = out[1:] if out[0]["role"] == "system" else out
    for i, m in enumerate(body):
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            at = i + len(out) - len(body)
            raise TemplateError(
                f"message {at}: expected a {want} message (a system message first, if any, then "
                f"user and assistant in turn), got {m['role']}"
            )
    last = "user" if for_prompt else "assistant"
    if not body or body[-1]["role"] != last:
        raise TemplateError(f"the conversation must end with a{'n' if last == 'assistant' else ''} {last} message")
    return out


BUILTIN: dict[str, ChatTemplate] = {
    # Raschka's format_input (chapter 7): the preamble, "### Instruction:", "### Input:" when the
    # record has an input, "### Response:"; the book's collate appends <|endoftext|> to the response.
    "alpaca": ChatTemplate(
        name="alpaca",
        system="{content}\n\n",
        default_system=ALPACA_SYSTEM,
        user="### Instruction:\n{content}\n\n",
        assistant="### Response:\n{content}",
        end=EOT_TEXT,
        input="\n\n### Input:\n{content}",
    ),
    # nanochat's render_conversation: <|bos|> (our end-of-text), the system text merged into the first
    # user turn, each turn between its role's start and end tokens.
    "nanochat": ChatTemplate(
        name="nanochat",
        bos=EOT_TEXT,
        user="<|user_start|>{content}<|user_end|>",
        assistant="<|assistant_start|>{content}",
        end="<|assistant_end|>",
    ),
}


def template_named(spec: str | Mapping[str, Any], where: str = "chat template") -> ChatTemplate:
    """A built-in template by name, or a user's template from its JSON form."""
    if isinstance(spec, str):
        if spec not in BUILTIN:
            raise TemplateError(
                f"{where}: unknown template {spec!r}; built in: {', '.join(BUILTIN)} "
                f"(or give the template itself as a JSON object)"
            )
        return BUILTIN[spec]
    return ChatTemplate.from_dict(spec, where)


def default_template(tok: Tokenizer) -> str:
    """The template a dataset gets when its options name none: nanochat's role tokens where the
    tokenizer has them (one trained here), else Alpaca's prompt."""
    return "nanochat" if set(ROLE_TOKENS) <= set(special_tokens(tok)) else "alpaca"


def read_template(folder: Path) -> ChatTemplate | None:
    """The template saved in a checkpoint folder, or None (a base model: trained on plain text)."""
    path = Path(folder) / TEMPLATE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TemplateError(f"{path}: unreadable ({e})") from None
    return ChatTemplate.from_dict(data, str(path))


def template_of(ckpt_dir: Path, manifest: Mapping[str, Any] | None = None, where: str = "") -> ChatTemplate | None:
    """The template a checkpoint's prompts are rendered with, decided here for every command: the one
    fine-tuning saved beside its weights (TEMPLATE_FILE), else its questions' dataset's (`manifest`,
    read from `where`: a base model asked a tuned run's questions), else None (a base model)."""
    saved = read_template(ckpt_dir)
    if saved is not None or manifest is None or manifest.get("template") is None:
        return saved
    return ChatTemplate.from_dict(manifest["template"], where)
