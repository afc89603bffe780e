"""The documentation holds together: README.md is a front page, docs/ holds the reference, and
every relative link and #anchor between them (and from the code's comments) reaches its target;
the reference pages carry no dated measurement (those live in docs/log.md alone); the files, runs
and commands they name exist, docs/configs.md's tables are jaxgpt/config.py's fields, and each
example name is spelt one way.

No network, no JAX: only the markdown files and the .py sources are read. Anchors follow GitHub's
rules: a heading's text (inline markdown removed), lowercased, every character that is not a
letter, digit, '_', '-' or space dropped, each space turned into '-', and "-1", "-2", ... added to
repeats.
"""

from __future__ import annotations

import ast
import csv
import re
from pathlib import Path
from urllib.parse import unquote

from conftest import ROOT, parse_python

README = ROOT / "README.md"
DOCS = ROOT / "docs"
LOG = DOCS / "log.md"  # the measurement log: the one page whose figures carry dates and commits

README_MAX_LINES = 150

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) and ![alt](target), an optional "title" after the target; [label]: target.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
HTML_ID = re.compile(r"<a\b[^>]*?\b(?:id|name)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _lines_outside_fences(text: str) -> list[str]:
    """The lines that are not inside a fenced code block (the fences themselves dropped)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return out


def _prose(text: str) -> str:
    """Text without code blocks and inline code, where a link can actually be a link."""
    return INLINE_CODE.sub(" ", "\n".join(_lines_outside_fences(text)))


def heading_text(raw: str) -> str:
    """A heading's visible text: links to their text, code and emphasis markers dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text).strip()


def github_slug(text: str) -> str:
    """GitHub's anchor of a heading whose visible text is `text` (github-slugger's rules)."""
    text = text.lower()
    text = "".join(c for c in text if c in "-_ " or c.isalnum())
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The visible text of every heading of a markdown file, in order."""
    return [
        heading_text(m.group(2))
        for line in _lines_outside_fences(path.read_text(encoding="utf-8"))
        if (m := HEADING.match(line))
    ]


def anchors(path: Path) -> set[str]:
    """Every anchor a link into `path` may name: its headings' slugs (repeats numbered) and the
    ids of explicit <a id="..."> / <a name="..."> tags."""
    seen: dict[str, int] = {}
    out = set()
    for text in headings(path):
        slug = github_slug(text)
        if slug in seen:
            seen[slug] += 1
            out.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            out.add(slug)
    out.update(HTML_ID.findall(path.read_text(encoding="utf-8")))
    return out


def relative_links(path: Path) -> list[str]:
    """The targets of the links and images of a markdown file that are not URLs with a scheme."""
    prose = _prose(path.read_text(encoding="utf-8"))
    targets = INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose) + HTML_ATTR.findall(prose)
    targets = [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in targets]
    return [t for t in targets if not SCHEME.match(t)]


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of `path` whose file or #anchor does not exist."""
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root)}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: {dest} does not exist")
            continue
        if not anchor:
            continue
        if dest.suffix == ".md":
            if unquote(anchor) not in anchors(dest):
                problems.append(
                    f"{where}: no heading of {dest.relative_to(root)} has the anchor "
                    f"#{anchor} (it has: {', '.join(sorted(anchors(dest)))})"
                )
        elif not re.fullmatch(r"L\d+(-L\d+)?", anchor):
            problems.append(f"{where}: #{anchor} into a file that is not markdown")
    return problems


def test_github_slug_rules():
    assert github_slug("More than one device / host") == "more-than-one-device--host"
    assert github_slug("train.json") == "trainjson"
    assert github_slug(heading_text("nanoGPT's numbers: `runs/shakespeare-char`")) == (
        "nanogpts-numbers-runsshakespeare-char"
    )
    assert github_slug("Watching a run: TensorBoard, metrics.jsonl, MFU, profiles") == (
        "watching-a-run-tensorboard-metricsjsonl-mfu-profiles"
    )
    assert github_slug(heading_text("`scan_layers` and **ReLU²**")) == "scan_layers-and-relu²"


def test_link_checker_sees_a_broken_link(tmp_path):
    """The checker itself: a missing file and a missing anchor are both reported, code is not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A section, here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-section-here) [ok](#page) [ok](other.md) [web](https://x.org/a)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [bad self](#nowhere)\n"
        "`[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n"
    )
    problems = link_problems(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert "missing.md" in problems[0] and "#nowhere" in problems[1] and "#nowhere" in problems[2]


def test_every_relative_link_and_anchor_resolves():
    problems = [p for path in markdown_files() for p in link_problems(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_page_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines: it is the front page; reference material goes to docs/"
    )
    m = re.search(r"^## The two commands\n\n```bash\n(.*?)\n```", text, re.M | re.S)
    assert m, "README.md lost its 'The two commands' block"
    commands = [line.split("#")[0].strip() for line in m.group(1).splitlines()]
    assert commands == ["uv run train.py runs/a-to-a", "uv run pytest"], commands


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "uv run pytest", commands[-1]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {
        (README.parent / unquote(t.partition("#")[0])).resolve() for t in relative_links(README) if t.partition("#")[0]
    }
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    unlinked = [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked]
    assert not unlinked, f"pages not linked from README.md: {unlinked}"


CODE_REFERENCE = re.compile(r"\b(README|docs/[\w.-]+\.md)[\s#]+\"([^\"\n]+)\"")


def _sources() -> list[Path]:
    return sorted([*ROOT.glob("*.py"), *(ROOT / "bench").glob("*.py"), *(ROOT / "jaxgpt").rglob("*.py")])


def test_code_comments_name_real_pages_and_sections():
    """`docs/<page>.md "Section"` in a comment or message names a page and one of its headings;
    `README "Section"` only a heading the README still has."""
    problems = []
    for source in _sources():
        for m in CODE_REFERENCE.finditer(source.read_text(encoding="utf-8")):
            page = README if m.group(1) == "README" else ROOT / m.group(1)
            where = f'{source.relative_to(ROOT)}: {m.group(1)} "{m.group(2)}"'
            if not page.exists():
                problems.append(f"{where}: {page.relative_to(ROOT)} does not exist")
                continue
            if m.group(2) not in headings(page):
                problems.append(f"{where}: no such heading in {page.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- reference, not log
# A reference page says what holds; a measurement (with its date, machine, commit and command)
# goes to docs/log.md, and the page links to it. These are the marks a dated measurement or a
# piece of the project's history leaves in a page.
ISO_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_HEX = r"[0-9a-f]{7,12}"
COMMIT = re.compile(rf"`({_HEX})`|\b(?:[Aa]t|[Oo]f|[Cc]ommit:?)\s+({_HEX})\b")  # `hash`, at / of / commit hash
MACHINE_LOAD = re.compile(r"\bload(?:\s+average)?\s*[:=]?\s*~?\d", re.IGNORECASE)
HISTORY_PHRASES = ("this session", "the issue's", "before this option existed", "today's code")


def dated_marks(line: str) -> list[str]:
    """What in one line of a page marks a dated measurement or the project's history."""
    marks = [f"date {m.group(0)!r}" for m in ISO_DATE.finditer(line)]
    for m in COMMIT.finditer(line):
        word = m.group(1) or m.group(2)
        if re.search(r"\d", word) and re.search(r"[a-f]", word):  # a hash, not a number or a word
            marks.append(f"commit hash {word!r}")
    marks += [f"machine load {m.group(0)!r}" for m in MACHINE_LOAD.finditer(line)]
    marks += [f"build history {p!r}" for p in HISTORY_PHRASES if p in line.lower()]
    return marks


def dated_measurements(path: Path, root: Path = ROOT) -> list[str]:
    """One line per mark, as file:line: the mark, then the line."""
    return [
        f"{path.relative_to(root)}:{n}: {mark}: {line.strip()[:120]}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for mark in dated_marks(line)
    ]


def test_the_dated_measurement_detector_flags_a_dated_line_and_not_a_reference_one(tmp_path):
    dated = (
        "**Measured** (2026-12-01, Zen 5, load 1.8) at 535e817: 73.7 s, against `8301bda` "
        "(commit 2b7c62c, load average 9.5), a fresh clone of 8f6a794; "
        "the issue's 23 minutes, before this option existed"
    )
    marks = dated_marks(dated)
    assert [m.split()[0] for m in marks] == [
        "date",
        "commit",
        "commit",
        "commit",
        "commit",
        "machine",
        "machine",
        "build",
        "build",
    ], marks
    reference = (
        "`learning_rate` 6e-4 with 3.7% warm-up, `lr_init_factor` `1e-5`, weight decay 0.1 "
        "(jax 0.10.2, Python 3.11.7); it loads the checkpoint at step 20 (`20261129T101500Z-step-600`), "
        "at 1234567 tokens, checks each shard's sha256 (`deadbeef` is no hash: no digit), "
        "a download of 1.1 MB, `add_scalar`, heads at 128 dims, `fade` and `cafe123456789` too long"
    )
    assert dated_marks(reference) == [], dated_marks(reference)
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nWhat holds.\n\nMeasured 2026-12-03 at `2b7c62c`.\n")
    assert dated_measurements(page, root=tmp_path) == [
        "page.md:5: date '2026-12-03': Measured 2026-12-03 at `2b7c62c`.",
        "page.md:5: commit hash '2b7c62c': Measured 2026-12-03 at `2b7c62c`.",
    ]


def test_no_reference_page_carries_a_dated_measurement():
    """README.md and docs/*.md but the log: what holds, with a link to docs/log.md for figures."""
    problems = [p for path in markdown_files() if path != LOG for p in dated_measurements(path)]
    assert not problems, (
        "dated measurements in reference pages (move them to docs/log.md and link to it):\n" + "\n".join(problems)
    )


def test_every_log_table_is_a_csv_linked_from_its_entry():
    """docs/log/*.csv, the log's long tables: each is linked from docs/log.md and has a header row
    and rows of its length."""
    linked = {(LOG.parent / unquote(t.partition("#")[0])).resolve() for t in relative_links(LOG)}
    for path in sorted((DOCS / "log").glob("*.csv")):
        where = path.relative_to(ROOT)
        assert path.resolve() in linked, f"{where} is not linked from docs/log.md"
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
        assert len(rows) > 1 and all(len(r) == len(rows[0]) for r in rows), f"{where}: ragged or empty"


def test_the_watching_page_lists_every_tag_the_run_records():
    """docs/watching.md's table of tags is jaxgpt/tracking/metrics.py's TAGS (read without importing)."""
    source = (ROOT / "jaxgpt" / "tracking" / "metrics.py").read_text(encoding="utf-8")
    assigns = [n for n in ast.walk(parse_python(source)) if isinstance(n, (ast.Assign, ast.AnnAssign))]
    tags = next(
        ast.literal_eval(n.value)
        for n in assigns
        if "TAGS" in [getattr(t, "id", None) for t in getattr(n, "targets", [getattr(n, "target", None)])]
    )
    lines = (DOCS / "watching.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*tag\s*\|", line))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table += re.findall(r"`([^`]+)`", line.split("|")[1])
    listed = {t for t in table if not t.startswith("config/")}
    assert listed == set(tags), (
        f"missing from docs/watching.md: {sorted(set(tags) - listed)}; "
        f"not tags of metrics.TAGS: {sorted(listed - set(tags))}"
    )


# ----------------------------------------------------------------------------- names that exist
# A page that names a file, a run or a config key the code does not have sends a newcomer nowhere.
# docs/log.md is left out: it records what was measured on the code of its day.
REFERENCE_PAGES = [p for p in markdown_files() if p != LOG]
# Run directories the pages create with a command of their own (`import_gpt2.py import gpt2
# runs/gpt2`) or name as an example to make, rather than ship.
EXAMPLE_RUNS = {"gpt2", "my-gpt2", "my-edu-run", "x"}
# Other projects' files a page names by their base name (transformers' nanochat model).
OTHER_PROJECTS_FILES = {"modeling_nanochat.py", "convert_nanochat_checkpoints.py"}
TREE_PATH = re.compile(r"(?<![\w./~-])((?:jaxgpt|bench|tests|runs|docs)/[\w./-]*)")
# `uv run [options] X.py`, `python X.py`: a command line naming a script.
COMMAND = re.compile(r"(?:\buv run(?:\s+-{1,2}[\w-]+(?:[= ](?!-)[^\s\\]+)?)*|\bpython3?)\s+([\w./-]+\.py)\b")
PLACEHOLDER = re.compile(r"[<>*{}\[\]]")


def _inline_code(path: Path) -> list[tuple[int, str]]:
    """(line number, content) of every inline code span outside fenced blocks."""
    spans, fence = [], None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is None:
            spans += [(n, s.group(2)) for s in INLINE_CODE.finditer(line)]
    return spans


def _tree_files() -> set[str]:
    return {p.name for top in ("jaxgpt", "bench", "tests") for p in (ROOT / top).rglob("*") if p.is_file()}


def name_problems(path: Path, root: Path = ROOT, tree_files: set[str] | None = None) -> list[str]:
    """One line per file, run or command of `path` that does not exist under `root`: paths under
    jaxgpt/, bench/, tests/, runs/ and docs/ in inline code; a script named by a command line
    (`uv run X.py`, inline or in a code block) or by inline code that calls it (`evaluate.py
    --core`); a bare `X.py` that is neither at the root nor a file of jaxgpt/, bench/ or tests/.
    Placeholders (`runs/<name>`, globs) are skipped."""
    tree_files = _tree_files() if tree_files is None else tree_files
    rel = path.relative_to(root)
    problems = []

    def check(n: int, target: str, what: str) -> None:
        target = target.rstrip(".,;:")
        parts = target.split("/")
        if parts[0] == "runs" and len(parts) > 1 and parts[1] in EXAMPLE_RUNS:
            return
        if not (root / target).exists():
            problems.append(f"{rel}:{n}: {what} {target!r} does not exist")

    for n, span in _inline_code(path):
        for m in TREE_PATH.finditer(span):
            if not PLACEHOLDER.search(m.group(1)):
                check(n, m.group(1), "path")
        words = span.split()
        if words and re.fullmatch(r"[\w.-]+\.py", words[0]) and not COMMAND.search(span):
            if len(words) > 1:
                check(n, words[0], "command")
            elif not ((root / words[0]).exists() or words[0] in tree_files or words[0] in OTHER_PROJECTS_FILES):
                problems.append(f"{rel}:{n}: file {words[0]!r} is neither at the root nor in jaxgpt/, bench/, tests/")
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in COMMAND.finditer(line):
            if not PLACEHOLDER.search(m.group(1)):
                check(n, m.group(1), "script")
    return problems


def test_name_checker_sees_a_missing_file(tmp_path):
    (tmp_path / "jaxgpt").mkdir()
    (tmp_path / "jaxgpt" / "real.py").write_text("")
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "train.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text(
        "`jaxgpt/real.py`, `jaxgpt/gone.py`, `runs/tiny`, `runs/tinny`, `runs/<name>`, `runs/gpt2`, "
        "`train.py --restart`, `trian.py --restart`, `real.py`, `nowhere.py`, `~/.cache/jaxgpt/native`\n\n"
        "```bash\nuv run train.py runs/tiny\nuv run --extra cuda13 evaluate.py runs/tiny\n```\n"
    )
    problems = name_problems(page, root=tmp_path, tree_files={"real.py"})
    assert [p.split(": ", 1)[1] for p in problems] == [
        "path 'jaxgpt/gone.py' does not exist",
        "path 'runs/tinny' does not exist",
        "command 'trian.py' does not exist",
        "file 'nowhere.py' is neither at the root nor in jaxgpt/, bench/, tests/",
        "script 'evaluate.py' does not exist",
    ], problems


def test_every_file_run_and_command_the_pages_name_exists():
    assert not EXAMPLE_RUNS & {p.name for p in (ROOT / "runs").iterdir()}, "an example run is now shipped"
    tree_files = _tree_files()
    problems = [p for path in REFERENCE_PAGES for p in name_problems(path, tree_files=tree_files)]
    assert not problems, "\n".join(problems)


def _dataclass_fields(source: str) -> dict[str, list[str]]:
    """Each class of a module (read, not imported) -> its annotated fields, in order."""
    return {
        node.name: [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
        for node in parse_python(source).body
        if isinstance(node, ast.ClassDef)
    }


def _table_rows(text: str, heading: str) -> dict[str, str]:
    """The first column's backticked keys of the table under `## heading` -> that row."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            for key in re.findall(r"`([^`]+)`", first):
                rows[key] = line
    return rows


def test_configs_page_names_exactly_the_config_fields():
    """docs/configs.md's model.json and train.json tables list every field of ModelConfig and
    TrainConfig in jaxgpt/config.py and nothing else; the muon, mesh, wandb and dataset rows name
    every field of their sections."""
    fields = _dataclass_fields((ROOT / "jaxgpt" / "config.py").read_text(encoding="utf-8"))
    text = (DOCS / "configs.md").read_text(encoding="utf-8")
    model, train = _table_rows(text, "model.json"), _table_rows(text, "train.json")
    for table, cls in ((model, "ModelConfig"), (train, "TrainConfig")):
        assert set(table) == set(fields[cls]), (
            f"docs/configs.md vs {cls}: missing {sorted(set(fields[cls]) - set(table))}, "
            f"not fields {sorted(set(table) - set(fields[cls]))}"
        )
    for key, cls in (
        ("muon", "MuonConfig"),
        ("mesh", "MeshConfig"),
        ("wandb", "WandbConfig"),
        ("dataset", "DatasetConfig"),
    ):
        missing = [f for f in fields[cls] if f'"{f}"' not in train[key]]
        assert not missing, f"docs/configs.md's {key} row lacks {cls} fields {missing}"


NAME_USES = (
    re.compile(r"download_dataset\.py tokenizer ([\w.-]+)"),
    re.compile(r"--tokenizer[ =]([\w.-]+)"),
    re.compile(r"\"tokenizer\": \"([\w.-]+)\""),
    re.compile(r"(?<![\w./])runs/([\w.-]+)"),
)


def spelling_problems(texts: dict[str, str]) -> list[str]:
    """Run and tokenizer names spelt two ways across the pages (`edu-32k` beside `edu32k`): names
    equal once case, '-' and '_' are dropped."""
    spellings: dict[str, dict[str, str]] = {}
    for where, text in texts.items():
        for pattern in NAME_USES:
            for name in pattern.findall(text):
                name = name.rstrip(".")
                spellings.setdefault(re.sub(r"[-_]", "", name.lower()), {}).setdefault(name, where)
    return [
        f"{' / '.join(f'{n!r} ({w})' for n, w in sorted(seen.items()))}" for seen in spellings.values() if len(seen) > 1
    ]


def test_spelling_checker_sees_two_spellings():
    assert spelling_problems(
        {
            "a.md": "uv run download_dataset.py tokenizer edu-32k fineweb-edu",
            "b.md": '"tokenizer": "edu32k" and runs/tiny, runs/Tiny',
        }
    ) == ["'edu-32k' (a.md) / 'edu32k' (b.md)", "'Tiny' (b.md) / 'tiny' (b.md)"]


def test_each_example_name_is_spelt_one_way():
    problems = spelling_problems({str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in markdown_files()})
    assert not problems, "names spelt more than one way:\n" + "\n".join(problems)
