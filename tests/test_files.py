"""`write_atomic` writes in place where renaming would replace something that is not a file."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from common.files import write_atomic, write_json


def test_a_named_pipe_is_written_through_not_replaced(tmp_path: Path) -> None:
    """A rename onto `--json /dev/null` once replaced the machine's /dev/null with a file."""
    pipe = tmp_path / "out.fifo"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    write_json(pipe, {"ok": 1})
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)  # still a pipe
    assert json.loads(received[0]) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.fifo"]  # no temporary file left


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "a" / "result.json"
    write_atomic(target, "old")
    write_atomic(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in target.parent.iterdir()) == [
        "result.json"
    ]
