"""Library loggers and warnings that are not the user's concern.

bitsandbytes (imported by PEFT and by transformers' Trainer whenever it is installed) warns on
every import, on CPUs with AVX512-BF16, that an optional CPU kernel from the model hub is
missing: a second line on stderr before a command's one error line, with nothing to act on.
Since transformers 5.25 requires the `kernels` package, bitsandbytes asks it for that kernel,
and under `HF_HUB_OFFLINE=1` `kernels` says first that it skips the kernel's publisher check
(the same kernel, the same nothing to act on).

A tracked full run saves its adapter as an MLflow model after its summary is printed; there
`mlflow.transformers` narrates at INFO what it does with a PEFT model (three lines that
repeat the adapter model's docstring), and PEFT reads transformers' deprecated
`is_gradient_checkpointing` property, whose FutureWarning is PEFT's to act on. Either would
follow the command's summary, the one thing a user reads last. Only these are silenced: a
warning from either library about something the user did still shows.
"""

from __future__ import annotations

import logging
import warnings

# Logger name -> the lowest level that still shows.
QUIET_LOGGERS = {
    "bitsandbytes.backends.cpu.ops": logging.ERROR,
    "kernels._internals.hf_hub": logging.ERROR,
    "mlflow.transformers": logging.WARNING,
}
# (message regex, category, module regex) of library warnings with nothing for the user to do.
QUIET_WARNINGS = (
    ("`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
)


def quiet_library_notices() -> None:
    """Raise `QUIET_LOGGERS`' levels and ignore `QUIET_WARNINGS`; safe before the libraries
    are imported (MLflow sets the level of its top logger only, never of `mlflow.transformers`)."""
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    for message, category, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
