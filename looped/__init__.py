"""looped: the executable companion to "How Much Is One Recurrence Worth?" (arXiv:2604.21106).

Modules: config (presets), accounting (N, FLOPs, tokens), model, data, optim, train, sweep,
fit, plots.  Torch is imported only by the modules that need it.
"""
from .config import ConfigError, ModelConfig, PRESETS, get_preset, model_config

__version__ = "0.1.0"
