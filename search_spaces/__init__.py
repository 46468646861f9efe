"""Declarative search spaces and batch profiles, in YAML, with a small loader.

Usage::

    space = load_space()                  # packaged default.yaml and profiles.yaml
    config = sample(trial, space)         # inside an Optuna objective
    config = params_from_trial_params(frozen_trial.params, space)

This package never imports ``hpo``.
"""

from __future__ import annotations

from search_spaces.domains import Choice, Domain, IntRange, LogUniform, Uniform
from search_spaces.profiles import Profile
from search_spaces.sampling import params_from_trial_params, profile_param_name, sample
from search_spaces.space import KNOWN_KEYS, SearchSpace, load_space, parse_space

__all__ = [
    "KNOWN_KEYS",
    "Choice",
    "Domain",
    "IntRange",
    "LogUniform",
    "Profile",
    "SearchSpace",
    "Uniform",
    "load_space",
    "params_from_trial_params",
    "parse_space",
    "profile_param_name",
    "sample",
]
