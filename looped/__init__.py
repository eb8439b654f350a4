"""looped: the executable companion to "How Much Is One Recurrence Worth?" (arXiv:2604.21106).

Three layers, imports flowing one way (tests/test_layers.py):

- the core, ``looped.*``: what the paper defines: the model (config, accounting, model), the
  trainer (data, optim, memory, dist, train, records) and the fitter (solver, fit, law);
- ``looped.studies``: our studies and the paper's: grids, sweeps, cost estimates, published
  numbers and analyses, as numbers;
- ``looped.report``: the book's presentation: tables, figures, sentences and nbval checks.

Torch is imported only by the modules that train.
"""
from .config import PRESETS, ConfigError, ModelConfig, get_preset, model_config

__all__ = ["PRESETS", "ConfigError", "ModelConfig", "get_preset", "model_config"]
__version__ = "0.1.0"
