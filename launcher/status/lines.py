"""Progress and metrics recognised in a rank's output lines.

What is recognised, in this order (the first that matches gives the line's observation):
1. the user's regex (``--progress-regex``): named groups ``step`` and ``total`` give the
   progress, any other named group that matched a metric of that name;
2. a HuggingFace Trainer log dict, as its ProgressCallback/PrinterCallback print it
   (``{'loss': '0.6931', 'grad_norm': '1.23', 'learning_rate': '5e-05', 'epoch': '0.5'}``);
3. a tqdm bar (``45%|####      | 45/100 [00:10<00:12, 4.50it/s]``) gives step/total, and
   ``name=value`` pairs in its postfix metrics;
4. Katib's StdOut convention, ``name=value`` (several per line); ``step=``, ``global_step=``,
   ``iteration=`` give the step, ``step=N/M`` the step and the total.

Most lines are none of these, and they must cost next to nothing: a line is looked at only
when it holds a ``=``, a ``%|`` or a ``{``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from launcher.frameworks import every as frameworks


@dataclass(frozen=True)
class Observation:
    step: int | None = None
    total: int | None = None
    metrics: tuple[tuple[str, str], ...] = ()  # (name, value as text), in the order seen
    percent: float | None = None  # only from relayed posts (HF callback / SDK)
    eta: float | None = None  # idem
    rank: int | None = None  # global rank when the source knows it
    source: str = "line"  # "line" | "api" | "file" | "relay"


STEP_NAMES = frozenset(("step", "global_step", "iteration", "current_step"))
TOTAL_NAMES = frozenset(("total_steps", "max_steps"))

# Katib's default metrics filter, ([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?), made
# strict: the value must hold a digit and end where a word would (so `version=2.1.0`,
# `date=2024-01-01`, `time=12:30` and `x=1abc` are no metrics), and the name must not be the
# tail of a dotted or longer word (`a.b=1`).
_PAIR = re.compile(r"(?<![\w|.-])([\w|-]++)\s*+=\s*+([+-]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?)(?=$|[\s,;)\]}|])")
_STEP_OF = re.compile(r"(?<![\w|.-])(step|global_step|iteration|current_step)\s*=\s*(\d+)\s*/\s*(\d+)\b", re.IGNORECASE)
# An environment variable's look (`OMP_NUM_THREADS=1`, `NCCL_NSOCKS_PERTHREAD=4`): settings
# echoed at start-up, not metrics.
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
# Lines of the libraries beneath the program, whose `key=value` details are no metrics:
# glog-style lines from a framework's C++ side (`[W1023 12:00:00.1 ...]`, also behind `[rank0]:`),
# NCCL's `NCCL INFO`/`WARN`, the frameworks' own (launcher.frameworks), argparse's Namespace echo.
# Plain substring tests first: they cost tens of nanoseconds, a regex alternation microseconds.
_LIBRARY_MARKS = (
    "NCCL INFO",
    "NCCL WARN",
    "NCCL TRACE",
    *(mark for framework in frameworks() for mark in framework.library_lines),
    "Namespace(",
)
_GLOG = re.compile(r"(?:\[[\w.-]{1,32}\]:)?\[?[IWEF]\d{4} \d\d:\d\d:\d\d")
# tqdm's default bar: `{l_bar}{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]`.
_TQDM = re.compile(r"(?P<desc>.*?)\s*\d{1,3}%\|.*?\|\s*(?P<n>\d+)/(?P<total>\d+) \[[\d:]+<")
# torchrun's --tee/--local-ranks-filter prefix (`[default0]:`) or a framework's own `[rank0]:`.
_RANK_PREFIX = re.compile(r"\[[\w.-]{1,32}\]:")
# Keys that make a printed dict a HuggingFace Trainer log rather than any dict a program prints.
_HF_KEYS = frozenset(("loss", "learning_rate", "grad_norm", "epoch", "train_loss", "train_runtime"))
_HF_PREFIXES = ("eval_", "test_", "predict_", "train_")
_MAX_DICT = 16 * 1024


class LineParser:
    def __init__(self, pattern: re.Pattern[str] | None = None):
        """``pattern``: the user's ``--progress-regex`` (named groups step, total, metrics)."""
        self.pattern = pattern
        # The tqdm bar followed: (description, total) of the first bar seen, until it completes.
        # Other bars in between (HF's evaluation bar inside training) are not the job's progress.
        self._bar: tuple[str, int] | None = None
        self._bar_done = False

    def parse(self, text: str) -> Observation | None:
        # tqdm redraws in place with \r: what the line shows last is its last segment
        if "\r" in text:
            text = _last_segment(text)
        if self.pattern is not None:
            found = self._user(self.pattern, text)
            if found is not None:
                return found
        has_pair, has_bar = "=" in text, "%|" in text
        if not (has_pair or has_bar or "{" in text):
            return None  # the prefilter: most lines end here
        head = text.lstrip()
        if head[:1] == "[" and "{" in head:
            prefix = _RANK_PREFIX.match(head)
            if prefix:
                head = head[prefix.end() :].lstrip()
        if head[:1] == "{":
            return _hf_dict(head.rstrip())
        if not (has_pair or has_bar) or _library_line(text):
            return None
        step, total = self._tqdm(text) if has_bar else (None, None)
        pairs, pair_step, pair_total = _pairs(text) if has_pair else ((), None, None)
        if step is None:
            step = pair_step
        if total is None:
            total = pair_total
        if step is None and total is None and not pairs:
            return None
        return Observation(step=step, total=total, metrics=pairs)

    def _user(self, pattern: re.Pattern[str], text: str) -> Observation | None:
        match = pattern.search(text)
        if match is None:
            return None
        found = ((name, value) for name, value in match.groupdict().items() if value)
        return _observation(found, ("step",), ("total",))

    def _tqdm(self, text: str) -> tuple[int | None, int | None]:
        match = _TQDM.match(text)
        if match is None:
            return None, None
        n, total = int(match["n"]), int(match["total"])
        if total <= 0:
            return None, None
        bar = (match["desc"].strip(), total)
        if self._bar is None or (bar != self._bar and self._bar_done):
            self._bar, self._bar_done = bar, False
        if bar != self._bar:
            return None, None
        self._bar_done = n >= total
        return n, total


def _last_segment(text: str) -> str:
    for segment in reversed(text.split("\r")):
        if segment.strip():
            return segment
    return ""


def _library_line(text: str) -> bool:
    for mark in _LIBRARY_MARKS:
        if mark in text:
            return True
    return _GLOG.match(text) is not None


def _pairs(text: str) -> tuple[tuple[tuple[str, str], ...], int | None, int | None]:
    step = total = None
    metrics = []
    of = _STEP_OF.search(text) if "/" in text else None
    if of is not None:
        step, total = int(of[2]), int(of[3])
    for match in _PAIR.finditer(text):
        name, value = match[1], match[2]
        if _ENV_NAME.fullmatch(name):
            continue
        lower = name.lower()
        if lower in STEP_NAMES:
            if step is None:
                step = _int(value)
            if step is not None:
                continue
        elif lower in TOTAL_NAMES:
            if total is None:
                total = _int(value)
            if total is not None:
                continue
        metrics.append((name, value))
    return tuple(metrics), step, total


def _hf_dict(text: str) -> Observation | None:
    if len(text) > _MAX_DICT or text[-1:] != "}" or ":" not in text:
        return None
    try:
        logs = ast.literal_eval(text)  # a literal only: never code
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(logs, dict) or not any(
        isinstance(key, str) and (key in _HF_KEYS or key.startswith(_HF_PREFIXES)) for key in logs
    ):
        return None
    numbers = ((key, _number_text(value)) for key, value in logs.items() if isinstance(key, str) and key)
    return _observation(((key, text) for key, text in numbers if text is not None), STEP_NAMES, TOTAL_NAMES)


def _observation(pairs, step_names, total_names) -> Observation | None:
    """(name, value) pairs as an observation: the step's and the total's names give those."""
    step = total = None
    metrics = []
    for name, value in pairs:
        if name in step_names:
            step = _int(value)
        elif name in total_names:
            total = _int(value)
        else:
            metrics.append((name, value))
    if step is None and total is None and not metrics:
        return None
    return Observation(step=step, total=total, metrics=tuple(metrics))


def _number_text(value) -> str | None:
    """A number as printed; recent transformers print floats already formatted as strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return None
        return value.strip() or None
    return None


def _int(text: str) -> int | None:
    """A step or a total: a count, so never negative (``step=-1`` is no progress)."""
    try:
        number = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            return None
        number = int(as_float) if as_float.is_integer() else -1
    return number if number >= 0 else None
