"""Library loggers whose import-time warnings are not the user's concern.

bitsandbytes (imported by PEFT and by transformers' Trainer whenever it is installed) warns on
every import, on CPUs with AVX512-BF16, that an optional CPU kernel from the model hub is
missing: a second line on stderr before a command's one error line, with nothing to act on.
"""

from __future__ import annotations

import logging

QUIET_LOGGERS = ("bitsandbytes.backends.cpu.ops",)


def quiet_library_notices() -> None:
    """Raise the level of `QUIET_LOGGERS` to errors; safe before the library is imported."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
