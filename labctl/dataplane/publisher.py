"""The controller's files, handled by a thread of their own: pfc.json written, control.json watched.

A file system call can block for tens of milliseconds (measured: writing and renaming pfc.json on
ext4 took up to 23 ms while captures and run directories were being written), and a control loop
that waits for one leaves its lossless queues unwatched for that long. So the loop only hands the
latest counters over; this thread writes them (the newest wins, none queue up) and looks at
control.json's mtime, raising `control_changed` for the loop to pick up.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

WATCH_EVERY = 0.01   # seconds between looks at control.json


class Publisher:
    def __init__(self, counters_file: Path | None, control_file: Path | None):
        self.counters_file, self.control_file = counters_file, control_file
        self.control_changed = threading.Event()
        self._doc: dict | None = None
        self._cond = threading.Condition()
        self._control_mtime = 0.0
        self.written = 0
        threading.Thread(target=self._run, name="publisher", daemon=True).start()

    def publish(self, doc: dict) -> None:
        """Hand over the latest counters; returns at once."""
        with self._cond:
            self._doc = doc
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._doc is not None, timeout=WATCH_EVERY)
                doc, self._doc = self._doc, None
            if doc is not None and self.counters_file is not None:
                tmp = self.counters_file.with_suffix(".tmp")
                try:
                    tmp.write_text(json.dumps(doc))
                    tmp.replace(self.counters_file)
                    self.written += 1
                except OSError:
                    pass          # the lab directory is going away with the lab
            self._watch_control()

    def _watch_control(self) -> None:
        if self.control_file is None:
            return
        try:
            mtime = os.stat(self.control_file).st_mtime
        except OSError:
            return
        if mtime != self._control_mtime:
            self._control_mtime = mtime
            self.control_changed.set()
