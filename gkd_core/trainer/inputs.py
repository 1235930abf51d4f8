"""What a run trains on, resolved before any worker starts: the model folders, the tokenizer they
share, the training prompts and the held-out ones (read while Ray starts: ``prepare_in_background``).

An empty ``model.path``, ``teacher.path`` or ``data.files`` means the built-in demo's folder or file
(``models.prepare_demo``); from here on the demo is one more model folder and data file.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gkd_core.config import Config
from gkd_core.trainer import data, models


@dataclass
class Inputs:
    cfg: Config  # model.path and teacher.path filled in
    train: data.Prompts
    val: list[list[int]]  # held-out prompts, token ids
    pad_id: int
    said: str  # what was read, in one line


def prepare_in_background(cfg: Config, home: Path, log=print) -> Future[Inputs]:
    """``prepare`` in a daemon thread of its own: the inputs, or its error, in the future. (An executor's threads
    are joined at exit: a driver that failed meanwhile would wait for the demo's models to be made first.)"""
    future: Future[Inputs] = Future()

    def run() -> None:
        try:
            future.set_result(prepare(cfg, home, log))
        except BaseException as e:  # (carried to the caller, who raises it)
            future.set_exception(e)

    threading.Thread(target=run, name="load_data", daemon=True).start()
    return future


def prepare(cfg: Config, home: Path, log=print) -> Inputs:
    """Raises ``data.DataError`` with what to fix when the files or the tokenizers cannot be used."""
    # what the user named is checked first, in a moment: the demo's parts may take a while to make
    for what, path in (("model.path", cfg.model.path), ("teacher.path", cfg.teacher.path)):
        if path and not (Path(path) / "config.json").is_file():
            raise data.DataError(f"{what}: {path} is not a Hugging Face model folder (no config.json there); "
                                 "give the folder that save_pretrained wrote")
    d = cfg.data
    rows = {f: data.read_rows(f, d.prompt_key) for f in [*d.files, *d.val_files]}
    demo = None
    if not (cfg.model.path and cfg.teacher.path and cfg.data.files):
        demo = models.prepare_demo(home, cfg.model, log)

    def made() -> models.Demo:  # asked for a part the config leaves out: made above then
        assert demo is not None
        return demo

    student = cfg.model.path or str(made().student)
    teacher = cfg.teacher.path or str(made().teacher)
    tok = models.load_tokenizer(student, cfg.model.trust_remote_code)
    diff = models.first_difference(tok, models.load_tokenizer(teacher, cfg.teacher.trust_remote_code))
    if diff:
        raise data.DataError(f"the student's tokenizer ({student}) and the teacher's ({teacher}) differ: {diff}; "
                             "the teacher's top-k are token ids, so both models must share one tokenizer")
    files = d.files or [str(made().train)]
    train = data.load_prompts(files, tok, d.prompt_key, d.max_prompt_length, d.truncation, rows)
    said = f"data: {train.describe(d.max_prompt_length)}"
    if d.val_files or not d.files:
        val_files = d.val_files or [str(made().val)]
        val = data.load_prompts(val_files, tok, d.prompt_key, d.max_prompt_length, d.truncation,
                                rows).ids[:d.eval_prompts]
        said += f"; {len(val)} for evaluation from {', '.join(Path(f).name for f in val_files)}"
    else:
        val = data.hold_out(train, d.eval_prompts, d.seed)
        said += f"; {len(val)} of them held out for evaluation"
    resolved = msgspec.structs.replace(cfg, model=msgspec.structs.replace(cfg.model, path=student),
                                       teacher=msgspec.structs.replace(cfg.teacher, path=teacher))
    return Inputs(cfg=resolved, train=train, val=val, pad_id=models.pad_id(tok, models.eos_ids(student, tok)),
                  said=said)
