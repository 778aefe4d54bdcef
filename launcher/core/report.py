"""Deliver an outcome: one log line, the termination message, the exit code. Secrets redacted.

:func:`deliver` is the one place where ``retryable`` is decided (:func:`launcher.core.outcome.is_retryable`
of the exit code and the retryable set), for the log line and the termination message alike.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.core import log
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, LauncherError, Outcome, is_retryable
from launcher.core.redaction import redact

if TYPE_CHECKING:  # pydantic: only where settings are loaded (hand_over's process loads none)
    from launcher.core.settings import LauncherSettings

DEFAULT_TERMINATION_LOG = "/dev/termination-log"


def run_command(launcher_overrides: dict, body: Callable[[LauncherSettings], Outcome]) -> int:
    """The frame of every subcommand: load the launcher's own knobs, run ``body``, deliver its
    outcome, or the outcome of the launcher error that stopped it."""
    from launcher.core.settings import LauncherSettings, load

    termination_log, codes = None, None
    try:
        launcher = load(LauncherSettings, launcher_overrides)
        termination_log, codes = launcher.termination_log, launcher.retryable_exit_codes
        log.configure(launcher.log_format)
        return deliver(body(launcher), termination_log, codes)
    except LauncherError as error:
        return deliver(error.outcome(), termination_log, codes)


def refuse(launcher_overrides: dict, error: LauncherError) -> int:
    """Deliver ``error`` (bad input found before a job began) as every subcommand does."""

    def body(launcher: LauncherSettings) -> Outcome:
        raise error

    return run_command(launcher_overrides, body)


def print_plan(launcher_overrides: dict, build: Callable[[LauncherSettings], dict]) -> int:
    """``plan`` and ``policy``: print what ``build(launcher settings)`` returns, as JSON. Bad input
    is one line and exit 2, as everywhere; nothing is written to the termination log."""
    from launcher.core.settings import LauncherSettings, load

    launcher = None
    try:
        launcher = load(LauncherSettings, launcher_overrides)
        document = build(launcher)
    except LauncherError as error:
        return deliver(error.outcome(), None, launcher.retryable_exit_codes if launcher else None)
    try:
        print(redact(json.dumps(document, indent=2)), flush=True)
    except BrokenPipeError:  # `plan | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# Told every outcome delivered, redacted, with the retryable set, before the termination message
# is written: a job's status reporter sends it as the TrainJob's final status. The layers above
# install theirs through observe_delivery; core knows only this signature.
DeliveryObserver = Callable[[Outcome, frozenset[int]], None]
_observers: list[DeliveryObserver] = []


def observe_delivery(observer: DeliveryObserver) -> None:
    """Tell ``observer`` each outcome delivered from now on, until :func:`forget_delivery`."""
    _observers.append(observer)


def forget_delivery(observer: DeliveryObserver) -> bool:
    """Stop telling ``observer``; False when it was not (or no longer) told."""
    try:
        _observers.remove(observer)
    except ValueError:
        return False
    return True


def deliver(outcome: Outcome, termination_log: str | None, retryable_codes: frozenset[int] | None) -> int:
    """Log ``outcome``, write its termination message, return its exit code. ``retryable_codes``
    is the launcher's retryable set; None where the launcher's settings could not be loaded (the
    default set, which is also what the shipped runtimes' policy tolerates)."""
    from launcher.core import settings

    codes = DEFAULT_RETRYABLE_EXIT_CODES if retryable_codes is None else retryable_codes
    outcome = _said(outcome, codes)
    for observer in tuple(_observers):  # one may forget itself as it is told
        observer(outcome, codes)
    write_termination_log(outcome, termination_log, codes)
    _hand_off(outcome, codes, settings.handoff_path())
    return outcome.exit_code


def hand_over(outcome: Outcome, codes: frozenset[int], path: str) -> int:
    """What :func:`deliver` does in a launcher's own helper process (the initializer's download),
    which loads no settings: say the outcome, hand it to the launcher that started it (which writes
    the termination message), return its exit code."""
    outcome = _said(outcome, codes)
    _hand_off(outcome, codes, path)
    return outcome.exit_code


def _said(outcome: Outcome, codes: frozenset[int]) -> Outcome:
    """``outcome`` redacted, and said: one line (two with its evidence), unless a launcher below said it."""
    retryable = is_retryable(outcome.exit_code, codes)
    outcome = replace(
        outcome,
        message=redact(outcome.message),
        evidence=redact(outcome.evidence) if outcome.evidence else None,
        extra={k: _redacted(v) for k, v in outcome.extra.items()},
    )
    kind = "retryable" if retryable else "permanent"
    if outcome.said:
        pass  # the launcher nested below us said it; it holds the detail, we only exit with it
    elif outcome.exit_code == 0:
        log.info(outcome.message, exitCode=0)
    else:
        log.error(
            f"{outcome.message} -> exit {outcome.exit_code} ({kind}, {outcome.reason})",
            exitCode=outcome.exit_code,
            reason=outcome.reason,
            retryable=retryable,
        )
        if outcome.evidence:
            log.error(f"evidence: {outcome.evidence}")
    return outcome


def _hand_off(outcome: Outcome, codes: frozenset[int], path: str | None) -> None:
    """Under `trainer-launcher exec`, give it our outcome, so it exits with our detail rather
    than "bash exited with code 3" (complete or absent: written aside, then renamed)."""
    if path is None:
        return
    try:
        with open(f"{path}.tmp", "w") as handle:
            handle.write(json.dumps(outcome.to_json(codes)))
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass  # the launcher above is gone, or its directory: it judges from our exit code alone


def handed_off(path: str, exit_code: int) -> Outcome | None:
    """The outcome a launcher nested in our command handed us, if it is the one our command
    exited with (a nested launcher that ran earlier in a script does not speak for the script)."""
    try:
        with open(path) as handle:
            inner = Outcome.from_json(json.load(handle))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return replace(inner, said=True) if inner.exit_code == exit_code else None


def _redacted(value):
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    return value


def write_termination_log(outcome: Outcome, path: str | None, retryable_codes: frozenset[int]) -> None:
    """Kubernetes reads /dev/termination-log (it creates the file); elsewhere write only where asked."""
    if path is None:
        if not os.path.exists(DEFAULT_TERMINATION_LOG):
            return
        path = DEFAULT_TERMINATION_LOG
    try:
        with open(path, "w") as handle:
            handle.write(outcome.termination_message(retryable_codes))
    except OSError as error:
        log.error(f"could not write the termination message to {path}: {error.strerror}")
