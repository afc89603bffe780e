"""hellaswag_local.yaml's choices: each ending with the leading space llm.c scores it with (see the YAML)."""

from __future__ import annotations

from typing import Any


def process_docs(dataset: Any) -> Any:
    """A datasets.Dataset of rowanz-format records -> the same with "choices": [" " + ending, ...]."""
    return dataset.map(lambda doc: {"choices": [" " + ending for ending in doc["endings"]]})
