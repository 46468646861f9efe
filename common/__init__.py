"""Below every package: errors, CLI plumbing, flags, files, the one MLflow writer."""

from common.library_logs import quiet_library_notices

# Before any module of the project imports transformers' Trainer or PEFT.
quiet_library_notices()
