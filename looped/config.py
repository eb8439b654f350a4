"""Model configuration and named presets.

The paper fixes the *effective* depth (prelude + recurrent x r + coda) and varies r; width
comes from a size knob s.  A preset captures everything that is not r, s or the injection
mode, so the same code path builds the paper's 20-layer models and the small CPU models.
Kept free of torch so that the accounting and the fitter import in milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _checkout(root: Path) -> Path | None:
    """`root` if it is a looped checkout (the package imported from the source tree), else None."""
    return root if (root / "pyproject.toml").is_file() and (root / "runs").is_dir() else None


CHECKOUT = _checkout(PACKAGE.parent)  # None for an installed wheel
# Where runs/ (records), data/ (datasets) and slurm/ (scripts) go: the checkout; installed from a
# wheel, the current folder (the folder `looped` was started in).
REPO = CHECKOUT or Path.cwd()


def shipped(relative: str) -> Path:
    """A file the package ships (study grids, the paper's tables), by its path in the checkout,
    e.g. ``runs/gpu_grids.csv``: the checkout's copy, else the wheel's (``looped/runs/...``)."""
    return (CHECKOUT or PACKAGE) / relative


def repo_relative(path) -> str:
    """A path as a reader (or a committed results file) should see it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
INJECTIONS = ("none", "linear", "additive", "passthrough", "hyperconnect")


class ConfigError(ValueError):
    """An impossible architecture; the CLI turns it into a one-line error and exit code 2."""


class DataError(RuntimeError):
    """Missing, corrupt or exhausted data; the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Preset:
    """Everything shared by one family of models (the paper's, or our CPU-sized one)."""
    name: str
    width_per_s: int        # d_model = width_per_s * s, rounded up to `width_round`
    width_round: int
    head_dim: int
    n_prelude: int
    n_coda: int
    loop_depth: int         # recurrent layers at r=1; r divides it (iso-depth)
    seq_len: int
    vocab_size: int         # tokenizer vocabulary
    vocab_pad: int          # embedding/head rows are padded to a multiple of this
    batch_tokens: int       # tokens per optimizer step
    ref_s: float            # HyperP reference width (paper: s=10, d=640)
    eval_tokens: int = 65_536  # held-out tokens for the final validation loss
    softcap: float = 15.0
    lr_scale: float = 1.0   # default multiplier on HyperP's transferred LRs (re-based by an LR sweep)

    @property
    def effective_depth(self) -> int:
        return self.n_prelude + self.loop_depth + self.n_coda


PRESETS = {
    # The paper: 2 + 16 + 2 layers, head_dim 128, Llama-2 vocab (32001 -> 32064), T 2048.
    "paper": Preset("paper", 64, 128, 128, 2, 2, 16, 2048, 32001, 64, 262_144, 10, 70_778_880),
    # Our CPU preset: 1 + 8 + 1 layers (r in {1,2,4,8} still divides the loop), d = 4 s, the
    # paper's head_dim 128 (so every CPU width is a single head of dim d), a 1024-token BPE
    # trained on the embedded Shakespeare corpus, T 128, 8 rows per step.
    "cpu": Preset("cpu", 4, 2, 128, 1, 1, 8, 128, 1024, 64, 1_024, 4),
    # The CPU study's preset on the embedded prose corpus (`make corpus`): 1 + 8 + 1 layers,
    # d = 8 s with head_dim 8 (at least two heads from d = 16), a 2048-token BPE, T 128, 2048
    # tokens per step (studies prose-batch and prose-lr chose the batch and lr_scale 1.4).
    "prose": Preset("prose", 8, 8, 8, 1, 1, 8, 128, 2048, 64, 2_048, 8, 131_072, lr_scale=1.4),
    # The same model family and recipe on corpus v3 (durable Debian sources only, `make corpus`):
    # the second study, which anyone can rebuild (prose's corpus v2 needs an archive PyPI dropped).
    "prose3": Preset("prose3", 8, 8, 8, 1, 1, 8, 128, 2048, 64, 2_048, 8, 131_072, lr_scale=1.4),
    # A toy preset for unit tests: a forward+backward takes milliseconds.
    "tiny": Preset("tiny", 8, 16, 16, 1, 1, 8, 32, 256, 64, 256, 4, 4_096),
}


@dataclass(frozen=True)
class ModelConfig:
    """One concrete architecture.  Build it with `model_config(...)` to get validation."""
    d_model: int
    head_dim: int
    n_prelude: int
    n_loop_layers: int      # unique recurrent layers (loop_depth / r at iso-depth)
    n_coda: int
    r: int                  # recurrences per forward pass
    injection: str = "linear"
    lanes: int = 2          # hyperconnection lanes (only for injection='hyperconnect')
    bptt_k: int | None = None  # recurrences that get gradient; None means all r
    seq_len: int = 2048
    vocab_size: int = 32001
    vocab_pad: int = 64
    softcap: float = 15.0
    preset: Preset | None = None  # its family, resolved (to_dict and the records write the name)
    s: float | None = None

    @property
    def n_head(self) -> int:
        return self.d_model // self.head_dim

    @property
    def padded_vocab(self) -> int:
        return math.ceil(self.vocab_size / self.vocab_pad) * self.vocab_pad

    @property
    def k_bwd(self) -> int:
        """Recurrences that are differentiated through."""
        return self.r if self.bptt_k is None else self.bptt_k

    @property
    def looped(self) -> bool:
        return self.injection != "none"

    def to_dict(self) -> dict:
        """The fields as a run record writes them, the preset by its name ("" for none)."""
        return {**asdict(self), "preset": self.preset.name if self.preset else ""}

    def validate(self) -> "ModelConfig":
        if self.injection not in INJECTIONS:
            raise ConfigError(f"unknown injection {self.injection!r}; choose from {', '.join(INJECTIONS)}")
        if self.d_model <= 0 or self.head_dim <= 0 or self.d_model % self.head_dim:
            raise ConfigError(f"d_model={self.d_model} must be a positive multiple of head_dim={self.head_dim}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.r < 1 or self.n_loop_layers < 1 or self.n_prelude < 0 or self.n_coda < 0:
            raise ConfigError("r and the recurrent depth must be >= 1, prelude/coda depth >= 0")
        if self.injection == "none" and self.r != 1:
            raise ConfigError(f"injection 'none' (the plain model) needs r=1, got r={self.r}")
        if self.bptt_k is not None and not 1 <= self.bptt_k <= self.r:
            raise ConfigError(f"bptt_k={self.bptt_k} must lie in [1, r={self.r}]")
        if self.injection == "hyperconnect" and self.k_bwd < self.r:
            raise ConfigError("hyperconnections need full backpropagation (bptt_k must equal r)")
        if self.injection == "hyperconnect" and self.lanes < 1:
            raise ConfigError(f"hyperconnections need at least one lane, got {self.lanes}")
        if self.seq_len < 1 or self.vocab_size < 2:
            raise ConfigError("seq_len must be >= 1 and vocab_size >= 2")
        return self


def width(p: Preset, s: float) -> int:
    """d_model for size s: width_per_s * s rounded up to a multiple of width_round."""
    if s <= 0:
        raise ConfigError(f"size s must be positive, got {s}")
    return int(math.ceil(p.width_per_s * s / p.width_round) * p.width_round)


def size_used(p: Preset, s: float) -> float:
    """The size whose width `width(preset, s)` is exactly (d_model / width_per_s): s itself unless
    the width was rounded; a run records it as `s_model` beside the s it was asked for."""
    return width(p, s) / p.width_per_s


def size_note(p: Preset, s: float, narrowest: bool = False) -> str | None:
    """None where size `s` gives its width exactly; else a sentence saying which width it gets
    (d = width_per_s * s rounded up to a multiple of width_round), for a warning: a run keeps s in
    its record and name, with the rounded model's d_model, `s_model` and this note.  A size below
    the preset's narrowest model (d = width_round; the tests' tiny s = 1) gets that model without
    a note (no warning), unless `narrowest` (the run record's note)."""
    d = width(p, s)
    if d == p.width_per_s * s or d == p.width_round and not narrowest:
        return None
    return (f"size {s:g} gives d_model {d} on preset {p.name} (d = {p.width_per_s} s rounded up to a multiple "
            f"of {p.width_round}; sizes that need no rounding: multiples of {p.width_round / p.width_per_s:g})")


def get_preset(preset: Preset | str) -> Preset:
    """A preset by name (a Preset is returned as it is): the look-up made where a name comes in
    (the command line, `registry.load_study`, `model_config` called with a name); configs and runs
    carry the Preset itself."""
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[preset]


def model_config(preset: Preset | str = "paper", r: int = 1, s: float = 10, injection: str | None = None,
                 lanes: int = 2, bptt_k: int | None = None, **overrides) -> ModelConfig:
    """The iso-depth model of a preset: loop_depth / r unique recurrent layers run r times.

    r=1 with the default injection is the paper's plain ("noloop") model; pass
    injection='linear' with r=1 to get a looped model that simply runs its loop once.
    """
    p = get_preset(preset)
    if r < 1 or p.loop_depth % r:
        raise ConfigError(f"r={r} must divide the recurrent depth {p.loop_depth} of preset {p.name!r}")
    if injection is None:
        injection = "none" if r == 1 else "linear"
    if bptt_k == r:
        bptt_k = None  # differentiating through all r recurrences is plain full backprop
    d = width(p, s)
    # a model narrower than one head gets a single head of dim d
    cfg = ModelConfig(d_model=d, head_dim=min(p.head_dim, d), n_prelude=p.n_prelude,
                      n_loop_layers=p.loop_depth // r, n_coda=p.n_coda, r=r, injection=injection,
                      lanes=lanes, bptt_k=bptt_k, seq_len=p.seq_len, vocab_size=p.vocab_size,
                      vocab_pad=p.vocab_pad, softcap=p.softcap, preset=p, s=s)
    return replace(cfg, **overrides).validate()


R_VALUES = (1, 2, 4, 8)  # recurrences of the paper's iso-depth grid
DEFAULT_SEED = 42


def run_name(cfg: ModelConfig, budget: float | None = None, steps: int | None = None,
             lr_scale: float | None = None, seed: int = DEFAULT_SEED, batch_tokens: int | None = None,
             data_order: int | None = None) -> str:
    """A readable, unique name for a run within a study (its record's file name)."""
    parts = [f"C{budget:.3g}" if budget else f"steps{steps}", f"r{cfg.r}", f"s{cfg.s:g}"]
    if budget and steps:  # a cell's run trained for a set number of steps (e.g. matched tokens)
        parts.append(f"steps{steps}")
    if cfg.injection == "linear" and cfg.r == 1:  # a looped model run once, not the plain model
        parts.append("linear")
    if cfg.injection not in ("none", "linear"):
        parts.append(cfg.injection + (f"{cfg.lanes}" if cfg.injection == "hyperconnect" else ""))
    if cfg.bptt_k is not None:
        parts.append(f"k{cfg.bptt_k}")
    if lr_scale is not None and lr_scale != cfg.preset.lr_scale:
        parts.append(f"lr{lr_scale:g}")
    if seed != DEFAULT_SEED:
        parts.append(f"seed{seed}")
    if data_order is not None:
        parts.append(f"order{data_order}")
    if batch_tokens is not None and batch_tokens != cfg.preset.batch_tokens:
        parts.append(f"b{batch_tokens}")
    return "_".join(parts).replace("+", "")
