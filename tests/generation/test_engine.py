"""The generation engine in-process, without a server: stop strings across tokens, multi-token ends, split
UTF-8 characters, per-row sampling, seeds that give the same text alone or among sixteen, n samples of one
prompt sharing a prefill, cancelled rows freed at the next turn, and the text stream's hold-back rule."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.generation.engine import Engine
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.generation.text import REPLACEMENT, TextStream
from jaxgpt.model.gpt import build_model

TOK = get_tokenizer("bytes")
CFG = ModelConfig(architecture="gpt2", vocab_size=257, context_length=64, emb_dim=32, n_heads=2, n_layers=1)
PROMPT = TOK.encode("Spell the word: abc")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(build_model(CFG, seed=7), TOK, rows=16)


def draw(engine: Engine, prompt: list[int] = PROMPT, **kw) -> object:
    (done,) = engine.generate([prompt], SamplingParams(**{"max_tokens": 24, "temperature": 0.0, **kw}))
    return done


# ----------------------------------------------------------------------------- where an answer stops


def _ascii_pair(sampled: list[int]) -> int | None:
    """A token index k >= 2 where tokens k, k + 1 are printable ASCII and their text first occurs there."""
    text = TOK.decode(sampled)
    for k in range(2, len(sampled) - 1):
        pair = bytes(sampled[k : k + 2]).decode("latin-1")
        if all(32 <= t < 127 for t in sampled[k : k + 2]) and text.find(pair) == len(TOK.decode(sampled[:k])):
            return k
    return None


def test_a_stop_string_over_two_tokens_cuts_the_text_before_it(engine: Engine) -> None:
    seed, k = next((s, k) for s in range(3, 60) if (k := _ascii_pair(draw(engine, temperature=1.0, seed=s).sampled)))
    free = draw(engine, temperature=1.0, seed=seed)
    stop = TOK.decode(free.sampled[k : k + 2])  # two byte tokens: the stop string completes only at the second
    cut = draw(engine, temperature=1.0, seed=seed, stop=(stop,))
    assert cut.text.text == TOK.decode(free.sampled[:k]) and cut.finish_reason == "stop"
    assert cut.sampled == free.sampled[: k + 2]  # drawn up to the stop string's last token, then ended
    pieces = list(engine.stream(PROMPT, SamplingParams(24, temperature=1.0, seed=seed, stop=(stop,))))
    assert "".join(pieces) == cut.text.text  # a streamed answer never shows the stop string's first half


def test_a_multi_token_end_is_cut_with_what_follows_and_its_ids_are_drawn(engine: Engine) -> None:
    free = draw(engine, temperature=1.0, seed=5)
    end = tuple(free.sampled[4:7])  # three tokens of the answer as a template's end
    cut = draw(engine, temperature=1.0, seed=5, end=end)
    assert cut.sampled == free.sampled[:7] and cut.finish_reason == "stop"
    assert cut.text.text == TOK.decode(free.sampled[:4])
    streamed = "".join(engine.stream(PROMPT, SamplingParams(24, temperature=1.0, seed=5, end=end)))
    assert streamed == cut.text.text


def test_stop_ids_end_the_answer_uncounted_in_the_text_and_max_tokens_ends_it_at_length(engine: Engine) -> None:
    free = draw(engine, temperature=1.0, seed=6)
    stop = free.sampled[3]
    cut = draw(engine, temperature=1.0, seed=6, stop_ids=frozenset({stop}))
    first = free.sampled.index(stop)
    assert cut.sampled == free.sampled[: first + 1] and cut.finish_reason == "stop"
    assert cut.text.text == TOK.decode(free.sampled[:first])
    assert draw(engine, max_tokens=5).finish_reason == "length" and len(draw(engine, max_tokens=5).sampled) == 5


def test_a_character_split_over_tokens_appears_once_whole() -> None:
    text = TextStream(TOK)
    pieces = [text.push(b) for b in "aé€b".encode()]  # é is 2 bytes, € is 3
    assert pieces == ["a", "", "é", "", "", "€", "b"] and text.finish() == ""
    held = TextStream(TOK, stop=["xy"])
    assert [held.push(t) for t in TOK.encode("axaxy")] == ["a", "", "xa", "", ""] and held.stopped
    assert held.text == "axa"
    cut = TextStream(TOK)
    assert [cut.push(b) for b in "é".encode()[:1]] == [""] and cut.finish() == REPLACEMENT  # ended mid-character


# ----------------------------------------------------------------------------- rows and seeds


def test_a_seed_gives_the_same_answer_alone_or_among_sixteen(engine: Engine) -> None:
    params = SamplingParams(24, temperature=1.0, top_p=0.9, seed=11)
    alone = draw(engine, temperature=1.0, top_p=0.9, seed=11).sampled
    others = [TOK.encode(f"Reverse the letters: {'abcdefghijklmnop'[: i + 1]}") for i in range(15)]
    mixed = [SamplingParams(10 + i, temperature=0.5 + i / 10, top_k=5 + i, seed=i) for i in range(15)]
    crowd = engine.generate([*others[:7], PROMPT, *others[7:]], [*mixed[:7], params, *mixed[7:]])
    assert crowd[7].sampled == alone
    for prompt, p, done in zip(others, mixed, crowd[:7] + crowd[8:]):
        assert (
            done.sampled
            == draw(
                engine, prompt, **{k: getattr(p, k) for k in ("max_tokens", "temperature", "top_k", "seed")}
            ).sampled
        )


def test_each_row_samples_with_its_own_parameters(engine: Engine) -> None:
    greedy, few, letters = (
        SamplingParams(12, temperature=0.0),
        SamplingParams(12, temperature=1.0, top_k=1, seed=1),  # top-k 1 draws the most likely: greedy
        SamplingParams(12, temperature=2.0, seed=2, allowed_ids=tuple(TOK.encode("xyz"))),
    )
    a, b, c = engine.generate([PROMPT] * 3, [greedy, few, letters])
    assert a.sampled == b.sampled == draw(engine, max_tokens=12).sampled
    assert set(c.text.text) <= set("xyz") and len(c.sampled) == 12


def test_n_samples_of_a_prompt_share_one_prefill_and_draw_with_seed_plus_index(engine: Engine) -> None:
    before = dict(engine.counts)
    drawn = engine.generate([PROMPT], SamplingParams(16, temperature=1.0, seed=20), n=4)
    assert engine.counts["prefills"] - before["prefills"] == 1 and engine.counts["copies"] - before["copies"] == 3
    for i, done in enumerate(drawn):
        assert done.sampled == draw(engine, max_tokens=16, temperature=1.0, seed=20 + i).sampled
    assert len({tuple(d.sampled) for d in drawn}) == 4


def test_a_cancelled_request_frees_its_row_at_the_next_turn(engine: Engine) -> None:
    before = engine.counts["cancelled"]
    keep, gone = engine.submit(PROMPT, SamplingParams(40, temperature=1.0, seed=1), n=2)
    engine.step()
    engine.step()
    rows = {id(r) for r in engine.rows if r is not None}
    assert id(gone) in rows and id(keep) in rows
    engine.cancel([gone])
    engine.step()
    assert id(gone) not in {id(r) for r in engine.rows if r is not None} and gone.finish_reason == "cancelled"
    waiting = engine.submit(PROMPT, SamplingParams(4), n=1)[0]
    engine.cancel([waiting])
    engine.run([keep])
    assert waiting.finish_reason == "cancelled" and not waiting.sampled and not engine.has_work()
    assert engine.counts["cancelled"] - before == 2  # the row freed and the waiting one; keep finished
    assert [a.shape for a in engine.decoder._cache] == [(1, 16, 2, 16, 64), (1, 16, 2, 64, 16)]  # 16 rows, as made


def test_a_stream_stopped_early_cancels_its_request(engine: Engine) -> None:
    stream = engine.stream(PROMPT, SamplingParams(40, temperature=1.0, seed=9))
    next(piece for piece in stream if piece)
    stream.close()
    engine.step()
    assert not engine.has_work()


def test_a_full_context_stops_an_answer_or_slides_its_window(engine: Engine) -> None:
    long = list(np.random.default_rng(0).integers(0, 256, 60))
    stopped = draw(engine, long, max_tokens=30)
    assert len(stopped.sampled) == 4 and stopped.finish_reason == "length"  # 60 + 4 fill the 64-token context
    slid = draw(engine, long, max_tokens=30, on_full="slide")
    assert len(slid.sampled) == 30 and slid.sampled[:4] == stopped.sampled


def test_greedy_bursts_draw_what_one_step_per_turn_draws(engine: Engine) -> None:
    """Several greedy decode steps per program (the accelerator's dispatch-free path) against one step
    per turn: the same ids, text, ends and logprob-free outputs, for rows of different lengths that end
    mid-burst (max_tokens, a stop string, a stop id), a row near the context's end, and a greedy row
    beside a sampled one (which makes the turn single-step)."""
    model = build_model(CFG, seed=7)
    single, bursting = Engine(model, TOK, rows=4, burst=1), Engine(model, TOK, rows=4, burst=8)
    long = list(np.random.default_rng(1).integers(0, 256, 50))
    free = draw(single, max_tokens=40).sampled
    jobs = [
        (PROMPT, SamplingParams(40, temperature=0.0)),
        (TOK.encode("abc"), SamplingParams(21, temperature=0.0)),
        (PROMPT, SamplingParams(40, temperature=0.0, stop=(TOK.decode(free[11:13]),))),
        (PROMPT, SamplingParams(40, temperature=0.0, stop_ids=(free[18],))),
        (long, SamplingParams(30, temperature=0.0)),
        (long, SamplingParams(30, temperature=0.0, on_full="slide")),
    ]
    prompts, params = [j[0] for j in jobs], [j[1] for j in jobs]
    want, got = single.generate(prompts, params), bursting.generate(prompts, params)
    assert [r.sampled for r in got] == [r.sampled for r in want]
    assert [(r.text.text, r.finish_reason) for r in got] == [(r.text.text, r.finish_reason) for r in want]
    assert [len(r.sampled) for r in got][:2] == [40, 21] and got[2].finish_reason == got[3].finish_reason == "stop"
    assert bursting.counts["bursts"] >= 4 and single.counts["bursts"] == 0
    streamed = "".join(bursting.stream(PROMPT, SamplingParams(40, temperature=0.0)))
    assert streamed == want[0].text.text
    mixed = [SamplingParams(24, temperature=0.0), SamplingParams(24, temperature=1.0, seed=3)]
    assert [r.sampled for r in bursting.generate([PROMPT, PROMPT], mixed)] == [
        r.sampled for r in single.generate([PROMPT, PROMPT], mixed)
    ]


def test_bad_requests_are_refused_in_one_line(engine: Engine) -> None:
    for prompt, needle in (([], "at least one token"), ([300], "token id 300 is out of range")):
        with pytest.raises(ValueError, match=needle):
            engine.submit(prompt, SamplingParams())
    for kw, needle in (({"top_p": 0.0}, "top_p"), ({"max_tokens": -1}, "max_tokens"), ({"stop": ("",)}, "stop")):
        with pytest.raises(ValueError, match=needle):
            SamplingParams(**kw)


def test_top_k_draws_from_the_devices_candidates_give_the_hosts_tokens() -> None:
    """An engine that draws top-k rows from the step's candidates (top_on_device, an accelerator's
    default) gives every answer the tokens of one that draws from the whole logits, stop ids and
    n samples included; a turn with a row that needs its whole logits (top_p) takes them for all."""
    model = build_model(CFG, seed=8)
    prompts = [PROMPT, TOK.encode("Count: 1 2 3"), TOK.encode("x")]
    params = [
        SamplingParams(max_tokens=30, temperature=1.0, top_k=50, seed=1),
        SamplingParams(max_tokens=30, temperature=0.7, top_k=1, seed=2),
        SamplingParams(max_tokens=30, temperature=1.3, top_k=64, seed=3, stop_ids=frozenset({101, 102, 103})),
    ]
    mixed = [*params[:2], SamplingParams(max_tokens=30, temperature=1.0, top_k=50, top_p=0.9, seed=4)]
    got = {}
    for on_device in (True, False):
        engine = Engine(model, TOK, rows=8, top_on_device=on_device)
        top_k_only = engine.generate(prompts, params, n=2)
        steps = engine.counts["top_steps"]
        with_top_p = engine.generate(prompts, mixed)
        got[on_device] = [r.sampled for r in top_k_only], [r.sampled for r in with_top_p], steps, engine.counts
    assert got[True][:2] == got[False][:2]
    assert sum(len(s) for s in got[True][0]) > 100
    assert got[True][2] >= 29 and got[True][3]["top_steps"] == got[True][2]  # the mixed answers took none
    assert got[False][3]["top_steps"] == 0


def test_tail_bursts_give_the_same_answers_in_fewer_dispatches() -> None:
    """With tail_bursts (an accelerator's default) a burst runs when the longest greedy answer wants half
    of it: each answer still ends where it would, its last tokens drawn in one program, not step by step."""
    model = build_model(CFG, seed=9)
    prompts = [PROMPT, TOK.encode("Count: 1 2 3"), TOK.encode("x")]
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in (9, 13, 30)]
    got = {}
    for tail in (True, False):
        engine = Engine(model, TOK, rows=4, burst=8, tail_bursts=tail)
        answers = engine.generate(prompts, params)
        singles = engine.counts["steps"] - 8 * engine.counts["bursts"]
        got[tail] = [r.sampled for r in answers], [r.finish_reason for r in answers], singles
    assert got[True][:2] == got[False][:2]
    assert [len(s) for s in got[True][0]] == [9, 13, 30] and got[True][1] == ["length"] * 3
    # 30 tokens: the prefill's, then bursts of 8 (7 ids + the last logits) -> 1 + 8 + 8 + 8 = 25, 5 left:
    # one step each without tail bursts; with them, a burst (5 >= 8 // 2) and no single step
    assert got[False][2] == 5 and got[True][2] == 0
