"""What a task is: its config sections and the few steps that are its own.

The runner (:mod:`attnlab.runs.training`) owns every step that all tasks share: the run
directory and its lock, building and validating the config, resume, seeding, the engine,
reloading the best weights and writing results. A task only says what is specific to it, by
overriding the methods of :class:`Task` below. :class:`Run` is a finished run loaded for use;
the verbs it supports (predict, evaluate, attention, generate, translate, embed) are its
methods, and ``verbs`` lists them, so every command can dispatch through
:func:`attnlab.runs.load_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from attnlab.configs import ConfigBase, to_dict
from attnlab.errors import UserError

FORMAT = 2  # version of the config.json layout, the only one folder.read_config reads

# Fields a resumed run may change: they steer how long and how visibly it goes on, not what it
# learns from or what the model is.
RESUMABLE_FIELDS = frozenset(
    {
        "max_steps",
        "epochs",
        "max_minutes",
        "patience",
        "eval_every",
        "checkpoint_every",
        "log_every",
        "num_threads",
        "tensorboard",
        "target_loss",
        "keep_state",
    }
)


@dataclass
class RunConfig:
    """A run's config: one dataclass per section (data, model, train, ...), by section name,
    and for a task of several architectures the one chosen (``--arch``, a model registry name;
    empty for a task of one)."""

    task: str
    sections: dict[str, ConfigBase]
    arch: str = ""
    # the fields the user set (the command line, a TOML file of their own): a task may adapt
    # the other fields, which come from its bundled presets, to the data
    given: frozenset[str] = field(default=frozenset(), compare=False)

    def __getattr__(self, name: str) -> ConfigBase:
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(name)

    def to_json(self) -> dict[str, Any]:
        """The config.json layout: format, task, then each section as a dict; the model
        section starts with the run's ``arch`` when the task has several."""
        out: dict[str, Any] = {"format": FORMAT, "task": self.task}
        for name, part in self.sections.items():
            values = to_dict(part)
            out[name] = {"arch": self.arch, **values} if name == "model" and self.arch else values
        return out


@dataclass
class Setup:
    """What a task hands the runner for training: data, loss and validation, files to write."""

    prepared: Any  # the task's own prepared data (tokenizers, splits, ...)
    train_data: Any  # the engine's TrainData
    evaluate: Callable[[Any], dict[str, float]] | None
    files: dict[str, Callable[[Path], Any]] = field(default_factory=dict)  # name -> writer
    messages: list[str] = field(default_factory=list)  # printed by rank 0 before training


class Task:
    """One kind of run. Subclasses set the class attributes and override the hooks."""

    name: ClassVar[str]
    preset: ClassVar[str | None] = None  # a bundled base preset: presets/{preset}.toml
    preset_prefix: ClassVar[str] = ""  # --config NAME also finds presets/{prefix}_NAME.toml
    resumable: ClassVar[frozenset[str]] = frozenset()  # more fields a resume may change
    data_paths: ClassVar[tuple[str, ...]] = ()  # fields naming data files (saved resolved)
    train_only_paths: ClassVar[tuple[str, ...]] = ()  # of those, what only training reads
    list_paths: ClassVar[tuple[str, ...]] = ()  # of those, comma-separated lists of paths
    # The architectures `--arch NAME` chooses between (model registry names, the first the
    # default); empty: the task trains one. With several, ``preset`` may hold ``{arch}``.
    archs: ClassVar[tuple[str, ...]] = ()

    def sections(self) -> dict[str, type[ConfigBase]]:
        """Config sections that the command line and presets set, by name."""
        raise NotImplementedError

    def known_arch(self, arch: str) -> str:
        """``arch`` as a run records it, when the task trains it (one of ``archs``, or what a
        task that also takes folders accepts); a UserError naming the choices otherwise."""
        if arch not in self.archs:
            choices = ", ".join(self.archs)
            raise UserError(f"unknown --arch {arch!r} for {self.name}; one of {choices}")
        return arch

    def arch_help(self) -> str:
        """What ``--arch`` accepts, for the help page."""
        return " | ".join(self.archs)

    def presets(self, arch: str) -> list[str]:
        """The bundled presets a new run of ``arch`` starts from, later ones winning."""
        return [self.preset.format(arch=arch)] if self.preset else []

    def arch_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        """The sections of a run of ``arch`` (one of ``archs``); the same for every one unless
        the task overrides this (vision: each architecture's model config)."""
        return self.sections()

    def derived_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        """Sections the task fills in itself (e.g. a checkpoint's architecture); saved too."""
        return {}

    def check(self, cfg: RunConfig) -> None:
        """Cross-section validation that needs no data; raise ValueError naming the fix."""

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        """Load and prepare the data; fill in data-derived config fields (vocab sizes).

        ``resume``: the run continues from its checkpoint, whose weights already hold every
        step taken before training (a head fitted, a vocabulary built): those read the run's
        record instead. A resume before the first checkpoint is a fresh start."""
        raise NotImplementedError

    def build_model(self, cfg: RunConfig, setup: Setup) -> Any:
        """The model to train, built after seeding."""
        raise NotImplementedError

    def step(self, cfg: RunConfig) -> Callable[[Any, dict], Any]:
        """The engine's step function: loss of one micro-batch."""
        raise NotImplementedError

    def finish(
        self, cfg: RunConfig, setup: Setup, model: Any, run_dir: Path, device: str
    ) -> dict[str, Any]:
        """Results of the best weights (test metrics, a sample, ...) for results.json."""
        return {}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        """The lines `attnlab train` prints after training."""
        return []

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> Run:
        """A finished run of this task, loaded for use."""
        raise NotImplementedError

    def pretrained(self, run_dir: Path) -> Any:
        """The encoder a run of this task lends to fine-tuning and embeddings (a
        :class:`~attnlab.models.pretrained.Pretrained`); a pretraining task overrides this."""
        raise UserError(
            f"{run_dir} holds a {self.name!r} run, which lends no pretrained encoder; give an "
            "`attnlab train mlm` run, a checkpoint folder, or a registered name (attnlab models)"
        )


class Run:
    """A finished run loaded for use. Subclasses implement the verbs that apply to them."""

    verbs: ClassVar[tuple[str, ...]] = ()
    device: Any = "cpu"  # where the model lives; load_run sets it, every verb computes there
    # The `attnlab explore` page that draws this run's attention: "classifier", "bert", "gpt",
    # "translate", "vit" or "cnn" (attnlab.explore.page.PAGES); None: nothing to explore.
    explore_page: ClassVar[str | None] = None

    def __init__(self, run_dir: Path, config: RunConfig) -> None:
        self.run_dir, self.config = run_dir, config

    @property
    def task(self) -> str:
        return self.config.task

    def require(self, verb: str) -> None:
        """Refuse a verb this kind of run does not have, saying which it has."""
        if verb not in self.verbs:
            have = ", ".join(self.verbs) or "none"
            raise UserError(
                f"{self.run_dir} holds a {self.task!r} run, which cannot {verb}; "
                f"what it can do: {have}"
            )
