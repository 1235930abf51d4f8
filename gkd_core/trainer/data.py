"""Prompts from the files people already have: JSON lines, JSON or Parquet, verl's RL files as is.

``data.prompt_key`` (``prompt``, as in verl) holds either a list of chat messages, rendered with
the tokenizer's chat template and the generation prompt, or a plain string. Prompts longer than
``data.max_prompt_length`` tokens are dropped, cut from the left, or an error (``data.truncation``),
and counted. The order is shuffled anew every epoch from ``data.seed``; the position in that
order (prompts handed out so far) is what a checkpoint keeps, so a restart goes on with the next
unseen prompt, whatever its batch size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gkd_core.errors import GkdError

SUFFIXES = {".parquet": "Parquet", ".jsonl": "JSON lines", ".json": "JSON"}


class DataError(GkdError, ValueError):
    """A data file that cannot be used: the message says which, why and what to do."""


@dataclass
class Prompts:
    ids: list[list[int]]
    files: list[str]
    read: int = 0  # rows read
    dropped: int = 0  # longer than max_prompt_length, dropped
    truncated: int = 0  # longer than max_prompt_length, cut from the left
    chat: int = 0  # rendered with the chat template

    def describe(self, max_len: int) -> str:
        names = ", ".join(Path(f).name for f in self.files)
        over = (f"{self.dropped} longer than {max_len} dropped" if not self.truncated
                else f"{self.truncated} longer than {max_len} cut from the left")
        kind = f", {self.chat} as chat" if self.chat else ""
        return f"{len(self.ids)} prompts from {names} ({over}{kind})"


def read_rows(path: str, key: str) -> list:
    """The ``key`` column of one file, read with pyarrow (or json for a JSON array)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{path}: no such file (data.files and data.val_files are read relative to where the run "
                        "starts)")
    if p.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty: no prompts in it")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: cannot read a '{suffix}' file; use one of "
                        + ", ".join(f"{s} ({k})" for s, k in SUFFIXES.items()))
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(p).names
            _has_key(path, key, names)
            return pq.read_table(p, columns=[key]).column(key).to_pylist()
        if suffix == ".jsonl":
            import pyarrow.json as pj

            table = pj.read_json(p)
            _has_key(path, key, table.column_names)
            return table.column(key).to_pylist()
        rows = json.loads(p.read_text())
    except DataError:
        raise
    except Exception as e:  # pyarrow's and json's own errors say where in the file
        raise DataError(f"{path}: not readable as {SUFFIXES[suffix]}: {type(e).__name__}: {e}"[:500]) from None
    if isinstance(rows, dict) and isinstance(rows.get("data"), list):
        rows = rows["data"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path}: a JSON file must hold a list of objects (or {{\"data\": [...]}})")
    _has_key(path, key, sorted({k for r in rows[:100] for k in r}))
    return [r.get(key) for r in rows]


def _has_key(path: str, key: str, names: list[str]) -> None:
    if key not in names:
        raise DataError(f"{path}: no '{key}' column (data.prompt_key); it has: {', '.join(names[:20])}")


def render(value, tok, where: str) -> tuple[list[int], bool]:
    """Token ids of one prompt, and whether it was a chat."""
    if isinstance(value, str):
        return list(tok(value, add_special_tokens=True)["input_ids"]), False
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) and "role" in m for m in value):
        if not getattr(tok, "chat_template", None):
            raise DataError(f"{where}: the prompt is a list of chat messages but the tokenizer has no chat "
                            "template; give plain strings, or a model folder whose tokenizer has one")
        ids = tok.apply_chat_template([dict(m) for m in value], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids), True
    raise DataError(f"{where}: a prompt must be a string or a list of {{role, content}} messages, not "
                    f"{type(value).__name__} {str(value)[:80]!r}")


def load_prompts(files: list[str], tok, key: str, max_len: int, truncation: str,
                 rows: dict[str, list] | None = None) -> Prompts:
    """The prompts of ``files`` as token ids (``rows``: the files' columns, when already read)."""
    out = Prompts(ids=[], files=list(files))
    for path in files:
        for i, value in enumerate(rows[path] if rows and path in rows else read_rows(path, key)):
            out.read += 1
            if value is None:
                raise DataError(f"{path}, row {i}: '{key}' is empty")
            ids, chat = render(value, tok, f"{path}, row {i}")
            out.chat += chat
            if len(ids) > max_len:
                if truncation == "error":
                    raise DataError(f"{path}, row {i}: the prompt is {len(ids)} tokens, more than "
                                    f"data.max_prompt_length={max_len}; raise it, or set data.truncation to "
                                    "drop or left")
                if truncation == "drop":
                    out.dropped += 1
                    continue
                ids = ids[-max_len:]
                out.truncated += 1
            if ids:
                out.ids.append(ids)
    if not out.ids:
        raise DataError(f"no prompts left in {', '.join(files)}: {out.read} read, {out.dropped} longer than "
                        f"data.max_prompt_length={max_len}")
    return out


@dataclass
class PromptOrder:
    """Which prompt comes next: a fresh permutation every epoch, and the position in them all."""

    n: int
    seed: int
    position: int = 0  # prompts handed out so far
    _epoch: int = -1
    _perm: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def epoch(self) -> int:
        return self.position // self.n

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            e, i = divmod(self.position, self.n)
            if e != self._epoch:
                self._epoch, self._perm = e, np.random.default_rng([self.seed, e]).permutation(self.n)
            out.append(int(self._perm[i]))
            self.position += 1
        return out


def hold_out(prompts: Prompts, k: int, seed: int) -> list[list[int]]:
    """``k`` prompts taken out of ``prompts`` (a fixed draw) for evaluation, when no val files are given."""
    k = min(k, len(prompts.ids) // 10)  # never more than a tenth of the training prompts
    if k <= 0:
        return []
    pick = set(np.random.default_rng([seed, 1 << 20]).choice(len(prompts.ids), size=k, replace=False).tolist())
    held = [ids for i, ids in enumerate(prompts.ids) if i in pick]
    prompts.ids = [ids for i, ids in enumerate(prompts.ids) if i not in pick]
    return held


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """([B, P] int32 ids, left-padded to the longest; [B] int32 count of pad tokens on each row)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    pads = np.zeros(len(rows), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        pads[i] = width - len(r)
    return ids, pads
