"""``accelerate launch`` under Trainer: Accelerate's reading of the line (accelerate_read.py, run in
the user's interpreter) turned into a torchrun line for ``trainer-launcher torch``, the world taken
from ``PET_*`` where the user set none.

``accelerate launch`` alone does not read ``PET_*``: on every pod of a 2-node TrainJob it starts a
one-machine job (and on a node without GPUs one process, whatever ``--num_processes`` says), so
training runs at the wrong world size without a word. Here:

- the world flags the user set, typed or in the config file, win as a typed torchrun flag does:
  ``--num_machines`` -> ``--nnodes``, ``--main_process_ip``/``--main_process_port`` ->
  ``--master-addr``/``--master-port``, ``--num_processes`` (the job's total) -> ``--nproc-per-node``
  (the total over the node count); the torchrun options (``--rdzv_backend``, ``--max_restarts``,
  ``--tee`` ...) keep their meaning;
- a config file's ``machine_rank`` is not this pod's rank: one file serves every pod, so the rank
  is the pod's (``PET_NODE_RANK``); a typed ``--machine_rank`` is kept;
- everything else comes from ``PET_*`` through the torch plan, as for any torchrun line;
- the ranks get the variables Accelerate computes from the flags and config file (mixed precision,
  FSDP, DeepSpeed, dynamo...), and, on a node without GPUs, ``ACCELERATE_USE_CPU``, without which
  each rank would see a world of one;
- on CPU a Python program runs through accelerate_run.py, which has ``PartialState`` read
  ``ACCELERATE_USE_CPU`` too: from accelerate 1.13 on, ``PartialState()`` alone (no ``Accelerator()``)
  would otherwise see a world of one in each rank.

Pure but for the last section (running the reader).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from launcher.core.outcome import ConfigError, UnsupportedVersion
from launcher.core.versions import release_of
from launcher.torch import args as torchrun_args
from launcher.torch.job import TorchPod, run_pod

USAGE = "accelerate launch [ACCELERATE FLAGS] SCRIPT [ARGS...]"
READER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_read.py")
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_run.py")
# From this release on, PartialState forms a world on CPU only when called with cpu=True.
PARTIAL_STATE_NEEDS_CPU = (1, 13)
# accelerate's torchrun options, by the torchrun flag each is
TORCHRUN = {
    "rdzv_backend": "--rdzv-backend",
    "rdzv_conf": "--rdzv-conf",
    "max_restarts": "--max-restarts",
    "monitor_interval": "--monitor-interval",
    "role": "--role",
    "tee": "--tee",
    "log_dir": "--log-dir",
}


@dataclass(frozen=True)
class Given:
    value: object
    source: str  # the flag as accelerate names it, or "<key> in <config file>"

    @property
    def typed(self) -> bool:
        return self.source.startswith("-")


@dataclass(frozen=True)
class Reading:
    """What Accelerate's own code read from the line (accelerate_read.py's document)."""

    version: str
    mode: str
    config: str | None
    given: dict[str, Given]
    env: dict[str, str]
    script: str
    script_args: tuple[str, ...]
    module: bool = False
    no_python: bool = False
    alone: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # the reader's own (an untested accelerate run anyway)

    @classmethod
    def from_json(cls, document: dict) -> Reading:
        program = document["program"]
        return cls(
            document["accelerate"],
            document["mode"],
            document.get("config"),
            {dest: Given(item["value"], item["from"]) for dest, item in document["given"].items()},
            dict(document["env"]),
            program["script"],
            tuple(program["args"]),
            bool(program["module"]),
            bool(program["noPython"]),
            dict(document.get("alone") or {}),
            tuple(document.get("warnings", ())),
        )


@dataclass(frozen=True)
class Translation:
    torchrun_args: tuple[str, ...]
    env: dict[str, str]
    notes: tuple[str, ...] = ()

    def to_json(self, reading: Reading, words: list[str]) -> dict:
        return {
            "argv": ["accelerate", "launch", *words],
            "accelerate": reading.version,
            "mode": reading.mode,
            "config": reading.config,
            "given": {dest: {"value": g.value, "from": g.source} for dest, g in reading.given.items()},
            "torchrun": ["torchrun", *self.torchrun_args],
            "env": self.env,
            "notes": list(self.notes),
            "alone": reading.alone,
        }


def translate(reading: Reading, env_nnodes: int) -> Translation:
    """The torchrun words for ``trainer-launcher torch`` and the ranks' added variables.
    ``env_nnodes``: the node count ``PET_NNODES`` gives (1 without it)."""
    given, flags, notes = reading.given, [], []
    nnodes = env_nnodes
    if "num_machines" in given:
        nnodes = _int(given["num_machines"], 1)
        flags += ["--nnodes", str(nnodes)]
    if "num_processes" in given:
        total = _int(given["num_processes"], 1)
        if total % nnodes:
            raise ConfigError(
                given["num_processes"].source,
                str(total),
                f"a multiple of the node count {nnodes}: it is the job's total number of processes",
            )
        flags += ["--nproc-per-node", str(total // nnodes)]
    rank = given.get("machine_rank")
    if rank is not None and rank.typed:
        flags += ["--node-rank", str(_int(rank, 0))]
    elif rank is not None:
        notes.append(
            f"{rank.source} left out: one config file serves every pod, so each pod's rank is its own (PET_NODE_RANK)"
        )
    if "main_process_ip" in given:
        flags += ["--master-addr", str(given["main_process_ip"].value)]
    port = given.get("main_process_port")
    if port is not None:
        if _int(port, 0) == 0:
            if nnodes > 1:
                raise ConfigError(
                    port.source,
                    "0",
                    f"the master's port: every one of the {nnodes} nodes must know it "
                    "(0, a free port, only works on one machine)",
                )
            flags += ["--standalone"]  # a free port of this machine, as accelerate's 0 means
        else:
            flags += ["--master-port", str(_int(port, 0))]
    for dest, flag in TORCHRUN.items():
        if dest in given:
            flags += [flag, str(given[dest].value)]
    flags += ["--no-python"] if reading.no_python else []
    if reading.mode == "cpu" and reading.no_python and release_of(reading.version) >= PARTIAL_STATE_NEEDS_CPU:
        notes.append(
            f"--no_python: {reading.script} does not run through the launcher's runner, so a PartialState() made "
            f"without cpu=True in a Python program it starts sees a world of one in each process on accelerate "
            f"{reading.version} (Accelerator() sees the whole world)"
        )
    if reading.mode == "cpu" and not reading.no_python:
        program = torchrun_args.program_argv((RUNNER, *_runner_target(reading), *reading.script_args))
    else:
        flags += ["--module"] if reading.module else []
        program = torchrun_args.program_argv((reading.script, *reading.script_args))
    return Translation((*flags, *program), dict(reading.env), (*reading.warnings, *notes))


def _runner_target(reading: Reading) -> list[str]:
    """The program as accelerate_run.py reads it after itself (launcher/runner/program.py)."""
    if reading.module:
        return ["-m", reading.script]
    return ["--", reading.script] if reading.script.startswith("-") else [reading.script]


def _int(given: Given, low: int) -> int:
    try:
        value = int(str(given.value))
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(given.source, str(given.value), f"a whole number >= {low}")
    return value


# --- the CLI's side (`trainer-launcher torch|plan|local --accelerate`): I/O from here on -----------


class Reader:
    """accelerate_read.py at work in ``python`` (default: this interpreter, the one the torch
    agent and its ranks run in): started at once, so that its ``import torch`` overlaps the
    launcher's own start and the agent's; :meth:`result` waits for its reading. ``overrides``:
    the launcher's flags (``--allow-untested-versions`` reaches the reader's version check)."""

    def __init__(self, words: list[str], python: str | None = None, overrides: dict | None = None):
        import subprocess
        import sys
        import tempfile

        self.words = words
        if not words or words[0] in ("-h", "--help"):
            self.process = None
            return
        env = dict(os.environ)
        allow = (overrides or {}).get("allow_untested_versions")
        if allow is not None:
            env["LAUNCHER_ALLOW_UNTESTED_VERSIONS"] = str(allow.value)
        self.scratch = tempfile.TemporaryDirectory(prefix="trainer-launcher-accelerate-")
        self.out = os.path.join(self.scratch.name, "reading.json")
        # Accelerate's own lines (its defaults, its warnings) go to a file: said only if it fails.
        with open(os.path.join(self.scratch.name, "said.txt"), "w") as said:
            self.process = subprocess.Popen(
                [python or sys.executable, READER, "--out", self.out, "--", *words],
                stdin=subprocess.DEVNULL,
                stdout=said,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def result(self, timeout: float = 300.0) -> Reading:
        import json

        if self.process is None:
            raise ConfigError(
                "accelerate launch",
                " ".join(self.words) or None,
                f"a script to launch: {USAGE} (accelerate's own help is: accelerate launch --help)",
            )
        with self.scratch:
            self.process.wait(timeout=timeout)
            with open(os.path.join(self.scratch.name, "said.txt"), errors="replace") as file:
                output = file.read()
            document = None
            if os.path.exists(self.out):
                with open(self.out) as file:
                    document = json.load(file)
        code = self.process.returncode
        if code == 2 and document and "error" in document:
            error = document["error"]
            if error.get("version"):
                raise UnsupportedVersion(f"{error['name']}={error['value']!r}: expected {error['expected']}")
            raise ConfigError(error["name"], None if error["value"] is None else str(error["value"]), error["expected"])
        if code != 0 or not document:
            tail = " | ".join(output.strip().splitlines()[-3:])
            raise RuntimeError(f"reading the accelerate line failed (exit {code}): {tail}")
        return Reading.from_json(document)


def read_here(words: list[str], python: str | None = None, overrides: dict | None = None) -> Reading:
    return Reader(words, python, overrides).result()


def env_nnodes() -> int:
    """The node count PET_* gives (the most, for an elastic MIN:MAX)."""
    from launcher.core import settings
    from launcher.torch.settings import TorchSettings

    return settings.load(TorchSettings).nnodes[1]


def run(overrides: dict, words: list[str]) -> int:
    """``accelerate launch WORDS`` as ``trainer-launcher torch`` runs a torchrun line."""
    return run_pod(overrides, AcceleratePod(words, overrides))


class AcceleratePod(TorchPod):
    """The torch pod, its torchrun words and ranks' variables read from an accelerate line: the
    reader starts with the agent; the plan waits for its reading."""

    def __init__(self, words: list[str], overrides: dict | None = None):
        super().__init__([])
        self.words, self.overrides = words, overrides

    def start_early(self, life) -> None:
        self.reader = Reader(self.words, overrides=self.overrides)
        super().start_early(life)

    def plan(self, life):
        from launcher.core import log

        translation = translate(self.reader.result(), env_nnodes())
        for note in translation.notes:
            log.warning(note)
        self.rest, self.extra_env = list(translation.torchrun_args), translation.env
        return super().plan(life)


def plan(words: list[str], torch_plan, overrides: dict | None = None) -> dict:
    reading = read_here(words, overrides=overrides)
    translation = translate(reading, env_nnodes())
    document = torch_plan(list(translation.torchrun_args))
    return {**document, "accelerate": translation.to_json(reading, words)}
