"""DCLM's CORE (core_bundle.py, core.py, scoring.core_score, evaluate.py --core, train.json
core_interval) on a bundle written here in the real bundle's formats (core.yaml, eval_meta_data.csv,
eval_data/*.jsonl; a folder and a zip), against nanochat's prompts written out by hand and an
independent scorer written here: plain numpy over a model's logits, one row at a time, as
nanochat's core_eval.evaluate_example decides."""

from __future__ import annotations

import json
import math
import random
import re
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, write_run
from flax import nnx
from model_reference import randomise
from tensorboard.backend.event_processing import event_accumulator
from test_hellaswag import gpt2_tok

import evaluate
from jaxgpt.checkpoints import layout
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig
from jaxgpt.data.tokenizer import BytesTokenizer
from jaxgpt.evaluation import core, core_bundle, scoring
from jaxgpt.model.gpt import build_model
from jaxgpt.tracking import metrics

WORDS = [
    "the",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "a",
    "mat",
    "hill",
    "over",
    "under",
    "bright",
    "red",
    "blue",
    "quick",
    "slow",
]

# core.yaml in the bundle's form: a task of each kind, few-shot > 0 on two of them, a delimiter of
# its own on the language-modeling one (nanochat's jeopardy-like "\nAnswer: ").
CORE_YAML = """\
icl_tasks:
-
  label: mc_task
  dataset_uri: commonsense_reasoning/mc_task.jsonl
  num_fewshot: [2]
  icl_task_type: multiple_choice
-
  label: schema_task
  dataset_uri: language_understanding/schema_task.jsonl
  num_fewshot: [0]
  icl_task_type: schema
-
  label: lm_task
  dataset_uri: world_knowledge/lm_task.jsonl
  num_fewshot: [1]
  icl_task_type: language_modeling
  continuation_delimiter: "\\nAnswer: "
"""
META_CSV = (
    "Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline,Centered Metric?,Description\n"
    'mc_task,commonsense reasoning,multiple choice,2,9,25,,"Four choices, a comma in here"\n'
    "schema_task,language understanding,schema,0,8,50,,Two options\n"
    "lm_task,world knowledge,language modeling,1,7,0,,Exact continuation\n"
)


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n))


def fixture_data() -> dict[str, list[dict]]:
    """Examples of each kind, of varied lengths (several padded row lengths, some over a 96-token context)."""
    rng = np.random.default_rng(3)
    mc = [
        {
            "query": f"Question: {words(rng, 2 + 3 * i)}?",
            "choices": [words(rng, int(rng.integers(1, 5))) for _ in range(2 + i % 3)],
            "gold": int(i % (2 + i % 3)),
        }
        for i in range(9)
    ]
    schema = [
        {
            "context_options": [f"The {words(rng, 2 + i)} because it", f"The {words(rng, 1 + i)} since"],
            "continuation": words(rng, 3 + i % 4) + ".",
            "gold": i % 2,
        }
        for i in range(8)
    ]
    lm = [{"context": f"  {words(rng, 4 + 5 * i)}.  ", "continuation": words(rng, 1 + i % 3)} for i in range(7)]
    return {
        "commonsense_reasoning/mc_task.jsonl": mc,
        "language_understanding/schema_task.jsonl": schema,
        "world_knowledge/lm_task.jsonl": lm,
    }


def write_bundle(
    root: Path, *, yaml_text: str = CORE_YAML, csv_text: str = META_CSV, data: dict[str, list | str] | None = None
) -> Path:
    """The bundle as the zip unpacks: root/eval_bundle/{core.yaml, eval_meta_data.csv, eval_data/...};
    a data file given as a str is written as those exact characters (UTF-8), a list as JSON lines."""
    bundle = root / "eval_bundle"
    (bundle / "eval_data").mkdir(parents=True)
    (bundle / "core.yaml").write_bytes(yaml_text.encode())
    (bundle / "eval_meta_data.csv").write_bytes(csv_text.encode())
    for name, records in (fixture_data() if data is None else data).items():
        (bundle / "eval_data" / name).parent.mkdir(parents=True, exist_ok=True)
        text = records if isinstance(records, str) else "".join(json.dumps(r) + "\n" for r in records)
        (bundle / "eval_data" / name).write_bytes(text.encode())
    return bundle


def zip_bundle(folder: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as z:
        for path in sorted(folder.rglob("*")):
            z.write(path, path.relative_to(folder.parent))  # eval_bundle/... as the real zip holds it
    return dest


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "bundle")


# ----------------------------------------------------------------------------- prompts and few-shot


def test_prompts_are_nanochats() -> None:
    """The strings nanochat's jinja templates render (core_eval.render_prompts_*), written out."""
    mc = [{"query": "Q1", "choices": ["a", "b"], "gold": 1}, {"query": "Q2", "choices": ["c", "d"], "gold": 0}]
    assert core.render_mc({"query": "Q3", "choices": ["x", "y z"], "gold": 0}, " ", mc) == [
        "Q1 b\n\nQ2 c\n\nQ3 x",
        "Q1 b\n\nQ2 c\n\nQ3 y z",
    ]
    assert core.render_mc({"query": "Q", "choices": ["x"], "gold": 0}, ": ", []) == ["Q: x"]
    schema = [{"context_options": ["He", "She"], "continuation": "ran.", "gold": 1}]
    assert core.render_schema({"context_options": ["A", "B"], "continuation": "sat.", "gold": 0}, " ", schema) == [
        "She ran.\n\nA sat.",
        "She ran.\n\nB sat.",
    ]
    lm = [{"context": " one two \n", "continuation": "three"}]
    # Contexts trimmed; the prompt without the continuation stripped whole (its delimiter's space too).
    assert core.render_lm({"context": "\tfour five ", "continuation": "six"}, "\nAnswer: ", lm) == [
        "one two\nAnswer: three\n\nfour five\nAnswer:",
        "one two\nAnswer: three\n\nfour five\nAnswer: six",
    ]
    assert core.render_lm({"context": "a b ", "continuation": "c"}, " ", []) == ["a b", "a b c"]


def test_fewshot_is_deterministic_and_never_the_example_itself(bundle: Path) -> None:
    tasks = core_bundle.read_tasks(bundle)
    mc = tasks[0]
    assert (mc.label, mc.shots) == ("mc_task", 2)
    draws = []
    for i, item in enumerate(mc.examples):
        shots = core.fewshot(mc.examples, i, mc.shots)
        assert len(shots) == 2 and all(s is not item for s in shots) and shots[0] is not shots[1]
        assert shots == core.fewshot(mc.examples, i, mc.shots)  # seeded by the index: the same every time
        draws.append(tuple(mc.examples.index(s) for s in shots))
    assert len(set(draws)) > 3  # not one fixed pair for every example
    assert core.fewshot(mc.examples, 0, 0) == []
    # The task's order is nanochat's: the file shuffled by random.Random(1337), then capped.
    data = fixture_data()["commonsense_reasoning/mc_task.jsonl"]
    random.Random(1337).shuffle(data)
    assert mc.examples == data and mc.total == 9
    assert core_bundle.read_tasks(bundle, limit=4)[0].examples == data[:4]


def test_rows_and_spans_follow_nanochat() -> None:
    """MC scores the choices after their common prefix, schema the common suffix, LM the continuation."""
    assert core.common_length([[1, 2, 3], [1, 2, 4, 5]], "left") == 2
    assert core.common_length([[9, 2, 3], [1, 2, 3]], "right") == 2
    assert core.common_length([[1, 2], [1, 2, 3]], "left") == 2
    assert core.spans("multiple_choice", [[0, 5, 6], [0, 5, 7, 8]]) == ([[0, 5, 6], [0, 5, 7, 8]], [2, 2], [3, 4])
    assert core.spans("schema", [[0, 1, 9, 9], [0, 2, 3, 9, 9]]) == ([[0, 1, 9, 9], [0, 2, 3, 9, 9]], [2, 3], [4, 5])
    assert core.spans("language_modeling", [[0, 1, 2], [0, 1, 2, 3, 4]]) == ([[0, 1, 2, 3, 4]], [3], [5])
    # A tokenizer that merges across the join: the common prefix is the start.
    assert core.spans("language_modeling", [[0, 1, 2], [0, 1, 7, 8]]) == ([[0, 1, 7, 8]], [2], [4])
    # Nothing left to score (start == end): a choice inside the common prefix, choices alike, schema
    # rows alike (wholly the common suffix: nanochat's slice from position 0, [-1:e - 1], is empty).
    assert core.spans("multiple_choice", [[0, 5], [0, 5, 7]])[1:] == ([2, 2], [2, 3])
    assert core.spans("multiple_choice", [[0, 5], [0, 5]])[1:] == ([2, 2], [2, 2])
    assert core.spans("schema", [[0, 1, 9], [0, 2, 8]])[1:] == ([3, 3], [3, 3])
    assert core.spans("schema", [[0, 1, 9], [0, 1, 9]])[1:] == ([3, 3], [3, 3])


# ----------------------------------------------------------------------------- scores


def np_core(tasks: list[core_bundle.Task], encode, logits_of, context: int, eot: int) -> dict:
    """The reference: per example nanochat's rows ([eot] + tokens), spans and left crop, per row the
    float64 log-softmax of its logits, then its decision and base_eval's arithmetic."""
    out, rows, gaps = {}, {"sums": [], "counts": [], "hits": []}, []
    for t in tasks:
        right = []
        for i, item in enumerate(t.examples):
            toks = [[eot, *encode(p)] for p in core.prompts(t, i)]
            if t.kind == "multiple_choice":
                n = min(map(len, toks))
                start = next((k for k in range(n) if len({tuple(x[: k + 1]) for x in toks}) > 1), n)
                spans = [(x, start, len(x)) for x in toks]
            elif t.kind == "schema":
                n = min(map(len, toks))
                suffix = next((k for k in range(n) if len({tuple(x[len(x) - k - 1 :]) for x in toks}) > 1), n)
                spans = [(x, len(x) - suffix, len(x)) for x in toks]
            else:
                assert toks[1][: len(toks[0])] == toks[0]  # nanochat's assertion (true of both tokenizers here)
                spans = [(toks[1], len(toks[0]), len(toks[1]))]
            means, all_hit = [], True
            for x, s, e in spans:
                crop = max(len(x) - context, 0)
                ids, s, e = np.array(x[crop:]), max(s - crop, 1), e - crop
                logits = np.asarray(logits_of(ids), np.float64)  # (T, V)
                logp = logits - logits.max(-1, keepdims=True)
                logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
                nll = -logp[np.arange(len(ids) - 1), ids[1:]]  # nll[k]: predicting ids[k + 1]
                hits = logits.argmax(-1)[s - 1 : e - 1] == ids[s:e]
                means.append(nll[s - 1 : e - 1].mean())
                all_hit &= bool(hits.all())
                rows["sums"].append(nll[s - 1 : e - 1].sum())
                rows["counts"].append(e - s)
                rows["hits"].append(int(hits.sum()))
            if t.kind != "language_modeling" and len(means) > 1:
                gaps.append(float(np.diff(np.sort(means)[:2])[0]))
            right.append(all_hit if t.kind == "language_modeling" else int(np.argmin(means)) == item["gold"])
        acc = float(np.mean(right))
        out[t.label] = {"accuracy": acc, "centered": (acc - t.baseline / 100) / (1 - t.baseline / 100)}
    return {
        "tasks": out,
        "core": float(np.mean([v["centered"] for v in out.values()])),
        "gaps": np.array(gaps),
        **{k: np.array(v) for k, v in rows.items()},
    }


@pytest.mark.parametrize(
    "tok_name,context", [pytest.param("bytes", 96, id="bytes"), pytest.param("gpt2", 40, id="gpt2", marks=SLOW)]
)
def test_scores_match_the_numpy_scorer(bundle: Path, tok_name: str, context: int) -> None:
    """A random GPT-2 (bytes, 96-token context; GPT-2's BPE, 40 tokens): rows of several padded
    lengths, the few-shot ones cut from the left; every row's summed loss, token count and argmax
    hits, every task's accuracy and centred accuracy and CORE as the numpy reference computes them."""
    tok = gpt2_tok() if tok_name == "gpt2" else BytesTokenizer()
    cfg = ModelConfig(
        architecture="gpt2",
        vocab_size=tok.n_vocab,
        context_length=context,
        emb_dim=32,
        n_heads=4,
        n_layers=2,
        qkv_bias=True,
        tie_embeddings=False,
    )
    model = build_model(cfg, seed=0)
    randomise(model, seed=5)  # peaky logits: a random init is near uniform, every choice alike
    # A frequent token (a space; GPT-2's " the") the argmax at many positions, so that some scored
    # tokens are predicted (a random model's argmax almost never is): its head column leans
    # towards ln_f's bias.
    w = np.array(model.head.kernel.get_value())
    w[:, tok.encode(" " if tok_name == "bytes" else " the")[0]] += 3.0 * np.asarray(model.ln_f.bias.get_value())
    model.head.kernel.set_value(jnp.asarray(w))
    tasks = core_bundle.read_tasks(bundle)
    prepared = core.prepare(tasks, tok, context_length=context, vocab_size=cfg.vocab_size)
    got = scoring.core_score(model, prepared, rows_per_call=8, progress=False)
    forward = nnx.jit(lambda m, x: m(x))

    def logits_of(ids: np.ndarray) -> np.ndarray:  # one row, at the full context: one compiled shape
        padded = np.zeros((1, context), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(forward(model, jnp.asarray(padded)))[0, : len(ids)]

    want = np_core(tasks, tok.encode, logits_of, context, tok.eot_id)
    assert (
        got["calls"] > 3
        and len({t.shape[1] for _c, t, _m in core.Calls(prepared, context_length=context, rows_per_call=8)}) >= 2
    )
    assert got["tasks"]["mc_task"]["truncated"] > 0 and not got["capped"]
    np.testing.assert_array_equal(got["counts"], want["counts"])
    np.testing.assert_array_equal(got["hits"], want["hits"])
    np.testing.assert_allclose(got["sums"], want["sums"], rtol=2e-5)
    assert 0 < got["hits"].sum() < got["counts"].sum()  # the argmax comparison sees hits and misses
    assert (want["gaps"] > 1e-3 * np.abs(want["sums"] / want["counts"]).max()).all()  # no near-ties: not luck
    for label, w in want["tasks"].items():
        assert got["tasks"][label]["accuracy"] == w["accuracy"], label
        assert got["tasks"][label]["centered"] == pytest.approx(w["centered"], abs=1e-12), label
    assert 0 < want["tasks"]["mc_task"]["accuracy"] < 1 and 0 < want["tasks"]["schema_task"]["accuracy"] < 1
    assert got["core"] == pytest.approx(want["core"], abs=1e-12)


def test_centred_accuracy_and_core_arithmetic(bundle: Path) -> None:
    """base_eval: centred = (acc - b/100) / (1 - b/100); CORE = their mean; LM right only when every
    continuation token is the argmax; MC/schema by the lowest mean loss, the first on a tie."""
    assert core.centred(0.25, 25) == 0.0 and core.centred(1.0, 50) == 1.0 and core.centred(0.2, 20) == 0.0
    assert core.centred(0.5, 25) == pytest.approx(1 / 3) and core.centred(0.3, 0) == 0.3
    assert core.centred(0.4, 50) == pytest.approx(-0.2)  # below chance: negative
    tasks = core_bundle.read_tasks(bundle, limit=3)
    prepared = core.prepare(tasks, BytesTokenizer(), context_length=512, vocab_size=257)
    n = [len(p.rows) for p in prepared]
    sums, counts, hits = np.ones(sum(n)), np.full(sum(n), 2.0), np.zeros(sum(n))
    # mc: make each example's gold row the lowest mean; schema: none right (the other option lowest, or a tie
    # that goes to the first row when gold is the second); lm: 2 of 3 rows all hits, one a hit short.
    for p, at in zip(prepared, np.cumsum([0] + n[:-1])):
        for e, ex in enumerate(p.task.examples):
            lo = at + p.first_row[e]
            if p.task.kind == "multiple_choice":
                sums[lo + ex["gold"]] = 0.5
            elif p.task.kind == "schema":
                sums[lo + 1 - ex["gold"]] = 0.5 if ex["gold"] == 0 else 1.0
            else:
                hits[lo] = 2.0 if e < 2 else 1.0
    r = core.results(prepared, sums, counts, hits)
    acc = {k: v["accuracy"] for k, v in r["tasks"].items()}
    assert acc == {"mc_task": 1.0, "schema_task": 0.0, "lm_task": pytest.approx(2 / 3)}
    assert r["core"] == pytest.approx((1.0 + (0.0 - 0.5) / 0.5 + 2 / 3) / 3) and r["capped"]
    assert r["tasks"]["mc_task"]["examples"] == 3 and r["tasks"]["mc_task"]["of"] == 9
    assert core.report(r)[-1].startswith(f"CORE {r['core']:.4f} (examples capped per task")


# ----------------------------------------------------------------------------- rows with nothing to score


def test_lowest_mean_is_nanochats_pick() -> None:
    """core_eval.evaluate_example: mean_losses.index(min(mean_losses)), a row with nothing scored
    having torch's mean over zero tokens, NaN: a NaN first row wins, a later one never, ties go first."""
    nan = math.nan
    assert core.lowest_mean([nan, 0.1, 0.2]) == 0 and core.lowest_mean([0.3, nan, 0.2]) == 2
    assert core.lowest_mean([0.3, nan, 0.4]) == 0 and core.lowest_mean([nan + 0, nan + 0]) == 0
    assert core.lowest_mean([0.5]) == 0 and core.lowest_mean([0.2, 0.1, 0.1]) == 1
    rng = random.Random(0)
    for _ in range(500):
        means = [rng.choice([nan, 0.1, 0.2, rng.random()]) + 0.0 for _ in range(rng.randint(1, 5))]
        assert core.lowest_mean(means) == means.index(min(means)), means


# Tasks whose examples are decided by where their rows with nothing to score stand, whatever the model
# (bytes tokenizer, 0-shot); schema without a delimiter, so that an empty continuation leaves no common last token.
EDGE_YAML = """\
icl_tasks:
- {label: mc_edge, dataset_uri: edge/mc.jsonl, num_fewshot: [0], icl_task_type: multiple_choice}
- {label: schema_edge, dataset_uri: edge/schema.jsonl, num_fewshot: [0], icl_task_type: schema,
   continuation_delimiter: ""}
- {label: lm_edge, dataset_uri: edge/lm.jsonl, num_fewshot: [0], icl_task_type: language_modeling}
"""
EDGE_CSV = "Eval Task,Random baseline\nmc_edge,25\nschema_edge,50\nlm_edge,0\n"
LM_ROWS = [{"context": "a b", "continuation": "c"}]  # model-decided: out of the hand counts below
# (example, right by nanochat's rules): delimiter " ", so "Q b" is a byte prefix of "Q b c".
MC_PREFIX_ROWS = [
    ({"query": "Q", "choices": ["b", "b c"], "gold": 0}, True),  # choice 0 NaN and first: wins
    ({"query": "Q", "choices": ["b", "b c"], "gold": 1}, False),
    ({"query": "Q", "choices": ["b c", "b"], "gold": 1}, False),  # a later NaN never wins
    ({"query": "Q", "choices": ["b c", "b", "b d"], "gold": 1}, False),
    ({"query": "Q", "choices": ["x", "x"], "gold": 1}, False),  # every row NaN: the first
    ({"query": "Q", "choices": ["only"], "gold": 0}, True),
]  # one choice, inside its own prefix
SCHEMA_EMPTY_ROWS = [
    ({"context_options": ["he ran", "she sat"], "continuation": "", "gold": 0}, True),
    ({"context_options": ["he ran", "she sat"], "continuation": "", "gold": 1}, False),
    ({"context_options": ["same", "same"], "continuation": " end", "gold": 1}, False),
]


@pytest.fixture(scope="module")
def tiny_model() -> nnx.Module:
    return build_model(ModelConfig(**MODEL), seed=0)  # random: the edge tasks' accuracies do not depend on it


def score_edges(
    root: Path,
    model: nnx.Module,
    mc: list | str,
    schema: list | str,
    lm: list = LM_ROWS,
    *,
    yaml_text: str = EDGE_YAML,
    csv_text: str = EDGE_CSV,
) -> tuple[list[core.PreparedTask], dict]:
    """The edge tasks (examples, or a file's exact text) through read_tasks, prepare and core_score:
    rows of at most 32 bytes, 4 a call, so every test here runs the one compiled program."""
    data = {"edge/mc.jsonl": mc, "edge/schema.jsonl": schema, "edge/lm.jsonl": lm}
    tasks = core_bundle.read_tasks(write_bundle(root, yaml_text=yaml_text, csv_text=csv_text, data=data))
    prepared = core.prepare(tasks, BytesTokenizer(), context_length=MODEL["context_length"], vocab_size=257)
    assert all(len(r) <= 32 for p in prepared for r in p.rows)
    return prepared, scoring.core_score(model, prepared, rows_per_call=4, progress=False)


def empty_rows(p: core.PreparedTask) -> dict[str, list[int]]:
    """Per example (its JSON), the rows left with nothing to score."""
    return {
        json.dumps(ex): [
            k
            for k in range(p.first_row[e + 1] - p.first_row[e])
            if p.starts[p.first_row[e] + k] == p.ends[p.first_row[e] + k]
        ]
        for e, ex in enumerate(p.task.examples)
    }


def test_a_choice_inside_the_common_prefix_scores_nan(tmp_path: Path, tiny_model: nnx.Module) -> None:
    """piqa's rows where one choice's tokens are a prefix of another's (once a CoreError that stopped
    the run): that choice scores nothing, its mean is NaN, and nanochat's pick decides the example."""
    prepared, r = score_edges(
        tmp_path, tiny_model, [ex for ex, _ in MC_PREFIX_ROWS], [ex for ex, _ in SCHEMA_EMPTY_ROWS]
    )
    assert empty_rows(prepared[0]) == {
        json.dumps(MC_PREFIX_ROWS[i][0]): rows for i, rows in enumerate([[0], [0], [1], [1], [0, 1], [0]])
    }
    assert r["tasks"]["mc_edge"]["accuracy"] == 2 / 6 == np.mean([right for _, right in MC_PREFIX_ROWS])
    assert r["tasks"]["mc_edge"]["centered"] == pytest.approx((2 / 6 - 0.25) / 0.75)
    lm = r["tasks"]["lm_edge"]["accuracy"]  # the one model-decided example (baseline 0: centred = accuracy)
    assert r["core"] == pytest.approx(np.mean([(2 / 6 - 0.25) / 0.75, (1 / 3 - 0.5) / 0.5, lm]))


def test_schema_rows_with_no_common_suffix_score_nan(tmp_path: Path, tiny_model: nnx.Module) -> None:
    """A schema example whose continuation is empty after its common suffix (once a CoreError): every
    row NaN, so the first option is picked; options alike likewise (their rows wholly the suffix)."""
    prepared, r = score_edges(tmp_path, tiny_model, [MC_PREFIX_ROWS[0][0]], [ex for ex, _ in SCHEMA_EMPTY_ROWS])
    assert set(map(tuple, empty_rows(prepared[1]).values())) == {(0, 1)}
    assert r["tasks"]["schema_edge"]["accuracy"] == 1 / 3 == np.mean([right for _, right in SCHEMA_EMPTY_ROWS])
    assert r["tasks"]["schema_edge"]["centered"] == pytest.approx((1 / 3 - 0.5) / 0.5)
    assert r["tasks"]["mc_edge"]["accuracy"] == 1.0


def test_empty_strings_are_read_and_scored(tmp_path: Path, tiny_model: nnx.Module) -> None:
    """An empty query, choice, context option, continuation or context (once refused as "non-empty
    string" fields): read, and scored as nanochat renders them."""
    mc = [
        {"query": "", "choices": ["", "z"], "gold": 0},  # rows " " and " z": choice 0 NaN and first, right
        {"query": "", "choices": ["", "z"], "gold": 1},
    ]
    schema = [
        {"context_options": ["", "a"], "continuation": "", "gold": 0},  # rows [eot] and [eot, a]: both NaN
        {"context_options": ["a", ""], "continuation": "", "gold": 0},
    ]
    lm = [{"context": "", "continuation": "x"}]  # prompts "" and " x": the row [eot, " ", "x"] scores 2
    prepared, r = score_edges(tmp_path, tiny_model, mc, schema, lm)
    assert [ex["query"] for ex in prepared[0].task.examples] == ["", ""]
    assert (prepared[2].starts.tolist(), prepared[2].ends.tolist()) == ([1], [3])
    assert (r["tasks"]["mc_edge"]["accuracy"], r["tasks"]["schema_edge"]["accuracy"]) == (0.5, 1.0)


def test_jsonl_lines_are_read_as_nanochat_reads_them(tmp_path: Path, tiny_model: nnx.Module) -> None:
    """base_eval.py's `for line in open(path)`: a line ends at \\n, \\r\\n or \\r only, so U+2028,
    U+2029 and U+0085 inside a JSON string (where str.splitlines() cut the line: malformed JSON) are
    text; json.loads(line.strip()): trailing form feeds and the like go; blank lines and a leading
    BOM (which would stop nanochat) are skipped."""

    def line(query: str, choices: list[str], gold: int) -> str:
        return json.dumps({"query": query, "choices": choices, "gold": gold}, ensure_ascii=False)

    mc = (
        "\ufeff"
        + line("Q\u2028a", ["b", "b c"], 0)
        + "\r\n"  # right (choice 0 NaN, first)
        + "\n \t\n\u2028\n"
        + line("Q\u2029\x85", ["b", "b c"], 1)
        + "\x0c\x0b\x1c \n"  # wrong
        + line("Q", ["b c\u2028", "b c"], 0)
        + "\r"  # right (choice 1 NaN, never picked)
        + line("Q", ["b", "b c"], 0)
    )  # right; no newline at the end
    prepared, r = score_edges(tmp_path, tiny_model, mc, [ex for ex, _ in SCHEMA_EMPTY_ROWS])
    assert sorted(ex["query"] for ex in prepared[0].task.examples) == ["Q", "Q", "Q\u2028a", "Q\u2029\x85"]
    assert r["tasks"]["mc_edge"]["accuracy"] == 3 / 4 and r["tasks"]["mc_edge"]["of"] == 4


def test_baselines_and_shots_are_read_as_base_eval_reads_them(tmp_path: Path, tiny_model: nnx.Module) -> None:
    """eval_meta_data.csv as pandas and base_eval.py read it: a leading BOM dropped, a task's first
    row its baseline (.values[0]), rows of tasks core.yaml does not list never read; num_fewshot's
    first value the shots."""
    csv_text = "\ufeffEval Task,Random baseline\nmc_edge,25\nmc_edge,50\nunlisted,n/a\nschema_edge,50\nlm_edge,0\n"
    yaml_text = EDGE_YAML.replace(
        "num_fewshot: [0], icl_task_type: multiple_choice", "num_fewshot: [0, many], icl_task_type: multiple_choice"
    )
    prepared, r = score_edges(
        tmp_path,
        tiny_model,
        [ex for ex, _ in MC_PREFIX_ROWS],
        [ex for ex, _ in SCHEMA_EMPTY_ROWS],
        yaml_text=yaml_text,
        csv_text=csv_text,
    )
    assert prepared[0].task.baseline == 25.0 and prepared[0].task.shots == 0
    assert r["tasks"]["mc_edge"]["centered"] == pytest.approx((2 / 6 - 0.25) / 0.75)


def test_a_language_modeling_row_with_nothing_to_score_is_one_line(tmp_path: Path) -> None:
    """nanochat asserts the continuation leaves a token (start_idx < end_idx) and stops there: so does
    this, in one line (a delimiter ending in whitespace, as all of the real bundle's do, always leaves one)."""
    yaml_text = EDGE_YAML.replace(
        "icl_task_type: language_modeling}", 'icl_task_type: language_modeling, continuation_delimiter: ""}'
    )
    data = {
        "edge/mc.jsonl": [MC_PREFIX_ROWS[0][0]],
        "edge/schema.jsonl": [SCHEMA_EMPTY_ROWS[0][0]],
        "edge/lm.jsonl": [{"context": "a b", "continuation": ""}],
    }  # prompts "a b" twice
    tasks = core_bundle.read_tasks(write_bundle(tmp_path, yaml_text=yaml_text, csv_text=EDGE_CSV, data=data))
    with pytest.raises(
        core_bundle.CoreError,
        match=r"^CORE task lm_edge, example 0: nothing to score \(the bytes "
        r"tokenization leaves the continuation empty; nanochat's assert",
    ):
        core.prepare(tasks, BytesTokenizer(), context_length=64, vocab_size=257)


# ----------------------------------------------------------------------------- the bundle's files


def test_a_zip_reads_as_its_folder(tmp_path: Path, bundle: Path) -> None:
    z = zip_bundle(bundle, tmp_path / "eval_bundle.zip")
    from_zip, from_dir, from_parent = (core_bundle.read_tasks(p) for p in (z, bundle, bundle.parent))
    assert from_zip == from_dir == from_parent and [t.label for t in from_zip] == ["mc_task", "schema_task", "lm_task"]
    assert [(t.kind, t.shots, t.delimiter, t.baseline) for t in from_zip] == [
        ("multiple_choice", 2, " ", 25.0),
        ("schema", 0, " ", 50.0),
        ("language_modeling", 1, "\nAnswer: ", 0.0),
    ]


BAD_CASES = {
    "no core.yaml": (lambda b: (b / "core.yaml").unlink(), "core.yaml: not in the eval bundle"),
    "yaml": (lambda b: (b / "core.yaml").write_text("icl_tasks: [\n"), "core.yaml: malformed YAML"),
    "kind": (
        lambda b: (b / "core.yaml").write_text(CORE_YAML.replace("icl_task_type: schema", "icl_task_type: qa")),
        "icl_tasks[1] (schema_task): icl_task_type='qa' is not one of",
    ),
    "shots": (lambda b: (b / "core.yaml").write_text(CORE_YAML.replace("[2]", "two")), "num_fewshot='two'"),
    "baseline row": (
        lambda b: (b / "eval_meta_data.csv").write_text(META_CSV.replace("lm_task,", "other,")),
        "eval_meta_data.csv: no row for task 'lm_task'",
    ),
    "baseline value": (
        lambda b: (b / "eval_meta_data.csv").write_text(META_CSV.replace(",50,", ",fifty,")),
        "eval_meta_data.csv:3: Random baseline 'fifty' is not a number",
    ),
    "json": (
        lambda b: _edit_line(b / "eval_data/world_knowledge/lm_task.jsonl", 3, "{oops"),
        "lm_task.jsonl:3: malformed JSON",
    ),
    "gold": (
        lambda b: _edit_line(
            b / "eval_data/language_understanding/schema_task.jsonl",
            2,
            json.dumps({"context_options": ["a", "b"], "continuation": "c", "gold": 2}),
        ),
        "schema_task.jsonl:2: 'gold' must be an index into the 2 options, got 2",
    ),
    "field": (
        lambda b: _edit_line(
            b / "eval_data/commonsense_reasoning/mc_task.jsonl",
            1,
            json.dumps({"question": "q", "choices": ["a"], "gold": 0}),
        ),
        "mc_task.jsonl:1: multiple_choice example has no 'query' (its keys: ['question', ",
    ),
    "type": (
        lambda b: _edit_line(
            b / "eval_data/world_knowledge/lm_task.jsonl", 2, json.dumps({"context": ["a"], "continuation": "b"})
        ),
        "lm_task.jsonl:2: language_modeling needs a string 'context', got ['a']",
    ),
    "no options": (
        lambda b: _edit_line(
            b / "eval_data/commonsense_reasoning/mc_task.jsonl", 4, json.dumps({"query": "q", "choices": [], "gold": 0})
        ),
        "mc_task.jsonl:4: multiple_choice needs 'choices' as a non-empty list of strings, got []",
    ),
    "no data": (
        lambda b: (b / "eval_data/world_knowledge/lm_task.jsonl").unlink(),
        "eval_data/world_knowledge/lm_task.jsonl: not in the eval bundle",
    ),
}


def _edit_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_a_bad_bundle_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    bundle = write_bundle(tmp_path / "b")
    damage, needle = BAD_CASES[case]
    damage(bundle)
    for path in (bundle, zip_bundle(bundle, tmp_path / "eval_bundle.zip")):
        with pytest.raises(core_bundle.CoreError) as e:
            core_bundle.read_tasks(path)
        assert needle in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value), str(e.value)


def test_caps_model_limits_and_missing_paths_are_one_line(tmp_path: Path, bundle: Path) -> None:
    with pytest.raises(
        core_bundle.CoreError,
        match=r"task mc_task has 2 examples \(capped to 2\), but "
        r"num_fewshot=2 needs at least 3",
    ):
        core_bundle.read_tasks(bundle, limit=2)
    with pytest.raises(core_bundle.CoreError, match="eval bundle not found"):
        core_bundle.read_tasks(tmp_path / "none.zip")
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(core_bundle.CoreError, match="junk.zip: not a readable zip file"):
        core_bundle.read_tasks(tmp_path / "junk.zip")
    tasks = core_bundle.read_tasks(bundle)
    with pytest.raises(
        core_bundle.CoreError,
        match=r"the bytes tokenizer's end-of-text id 256 is out of range for the "
        r"model's vocab_size=100",
    ):
        core.prepare(tasks, BytesTokenizer(), context_length=64, vocab_size=100)


def test_download_once_checked_and_offline_one_line(tmp_path: Path, bundle: Path) -> None:
    downloads = tmp_path / "downloads"
    zipped = zip_bundle(bundle, tmp_path / "upstream.zip")
    with pytest.raises(
        core_bundle.CoreError,
        match=r"cannot download http://127.0.0.1:9/eval_bundle.zip .*"
        r"put it at .*eval_bundle.zip, or pass --core-from",
    ):
        core_bundle.fetch_bundle(downloads, log=lambda _m: None, url="http://127.0.0.1:9/eval_bundle.zip")  # closed
    assert list(downloads.iterdir()) == []
    path = core_bundle.fetch_bundle(downloads, log=lambda _m: None, url=zipped.as_uri())  # file://, through urllib
    assert path == downloads / "eval_bundle.zip" and path.read_bytes() == zipped.read_bytes()
    assert core_bundle.read_tasks(path) == core_bundle.read_tasks(bundle)
    closed = "http://127.0.0.1:9/x"
    assert core_bundle.fetch_bundle(downloads, url=closed) == path  # once: no network the second time
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(core_bundle.CoreError, match="sha256 differs from the one recorded"):
        core_bundle.fetch_bundle(downloads, url=closed)


# ----------------------------------------------------------------------------- training and evaluate.py

MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 16, "n_heads": 2, "n_layers": 1}


def data_dir_with(tmp_path: Path, data_root: Path, bundle_zip: Path | None) -> Path:
    """The session's prepared builtin corpus, with (or without) the bundle in its downloads/."""
    root = tmp_path / "data"
    (root / "downloads").mkdir(parents=True)
    for name in data_root.iterdir():
        if name.name != "downloads":
            (root / name.name).symlink_to(name)
    if bundle_zip is not None:
        zip_bundle(bundle_zip, root / "downloads" / "eval_bundle.zip")
    return root


def test_training_checks_the_bundle_before_compiling(
    tmp_path: Path, data_root: Path, no_network: None, capsys: pytest.CaptureFixture
) -> None:
    import train

    run = write_run(
        tmp_path / "run", MODEL, {"microbatch_size": 2, "train_steps": 4, "checkpoint_interval": 2, "core_interval": 2}
    )
    assert train.main([str(run), "--data-dir", str(data_dir_with(tmp_path, data_root, None))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot download {core_bundle.BUNDLE_URL} (" in err
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="core_interval=3 must be a multiple of validation_interval=2"):
        TrainConfig(microbatch_size=2, train_steps=4, checkpoint_interval=2, core_interval=3)
    with pytest.raises(ConfigError, match="core_examples"):
        TrainConfig(microbatch_size=2, train_steps=4, core_examples=0)


@SLOW  # a short training run, then evaluate.py on its checkpoint
def test_training_with_core_interval_then_evaluate(
    tmp_path: Path, data_root: Path, bundle: Path, capsys: pytest.CaptureFixture
) -> None:
    """core_interval: CORE and each task's centred accuracy at steps 2 and 4 in meta.json, in
    TensorBoard (read back with its own reader) and charts/core.png; evaluate.py --core on the last checkpoint prints
    the same figures, per task and CORE, and --limit says the figure is capped."""
    import train

    data = data_dir_with(tmp_path, data_root, bundle)
    run = write_run(
        tmp_path / "run",
        MODEL,
        {
            "microbatch_size": 4,
            "train_steps": 4,
            "checkpoint_interval": 2,
            "validation_batches": 1,
            "learning_rate": 0.01,
            "core_interval": 2,
            "core_examples": 5,
        },
    )
    assert train.main([str(run), "--data-dir", str(data)]) == 0
    assert "step 4: CORE " in capsys.readouterr().out
    last = layout.latest_checkpoint(run)
    meta = layout.read_meta(last)
    assert [r["step"] for r in meta["core"]] == [4] and meta["core"][0]["capped"]
    first = layout.read_meta(next(c for c in layout.list_checkpoints(run) if layout.step_of(c) == 2))
    assert [r["step"] for r in first["core"]] == [2]
    tasks = meta["core"][0]["tasks"]
    assert set(tasks) == {"mc_task", "schema_task", "lm_task"} and all(t["examples"] == 5 for t in tasks.values())
    assert meta["core"][0]["CORE"] == pytest.approx(np.mean([t["centered"] for t in tasks.values()]))

    acc = event_accumulator.EventAccumulator(
        str(run / metrics.TENSORBOARD_DIR), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    tb = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert [s for s, _ in tb["core/CORE"]] == [2, 4]
    assert tb["core/CORE"][1][1] == pytest.approx(meta["core"][0]["CORE"], abs=1e-6)
    for label, t in tasks.items():
        assert [s for s, _ in tb[f"core/{label}"]] == [2, 4]
        assert tb[f"core/{label}"][1][1] == pytest.approx(t["centered"], abs=1e-6)
    assert (run / "charts" / "core.png").stat().st_size > 1000  # drawn with the other charts

    # evaluate.py on the final weights, the same 5 examples per task: the training run's figures.
    assert evaluate.main([str(run), "--core-from", str(bundle), "--limit", "5", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    for label, t in tasks.items():
        line = next(x for x in out.splitlines() if x.startswith(label + " "))
        assert f"accuracy {t['accuracy']:.4f} | centered {t['centered']:.4f}  (5 of " in line, line
    assert re.search(rf"^CORE {meta['core'][0]['CORE']:.4f} \(examples capped per task", out, re.MULTILINE), out
    # Uncapped: the whole fixture bundle, said without the note.
    assert evaluate.main([str(run), "--core-from", str(bundle.parent)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^CORE -?\d\.\d{4}$", out, re.MULTILINE) and "(9 of 9 examples" in out
    # A bad bundle through the command line: one line on stderr.
    (bundle / "eval_meta_data.csv").write_text(META_CSV.replace("mc_task,", "x,"))
    assert evaluate.main([str(run), "--core-from", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval_meta_data.csv: no row for task 'mc_task'" in err
