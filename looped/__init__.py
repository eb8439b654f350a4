"""looped: the executable companion to "How Much Is One Recurrence Worth?" (arXiv:2604.21106).

Modules: config (presets), accounting (N, FLOPs, tokens), model, data, optim, train, sweep
(studies and records), bench; the paper's numbers (paper); the fit (fit, solver) and what a
fitted law gives (law, case_studies); checks of the architecture (architecture); run-table
analysis (analysis); tables and figures for the book (tables, figures).  Torch is imported
only by the modules that need it.
"""
from .config import ConfigError, ModelConfig, PRESETS, get_preset, model_config

__version__ = "0.1.0"
