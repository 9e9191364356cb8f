"""A writer of small modern-schema Kineto traces for hand-computed test cases."""

from __future__ import annotations

import json
from pathlib import Path


class KinetoBuilder:
    """Write a modern-schema Kineto trace: one host process (pid 1), one GPU (device 0)."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.corr = 0
        self.devices: list[dict] = []

    def op(
        self,
        name: str,
        ts: float,
        dur: float,
        cat: str = "cpu_op",
        tid: int = 1,
        args: dict | None = None,
    ) -> None:
        """A CPU event; ``args`` adds e.g. ``Input Dims`` / ``Input type``."""
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": len(self.events) + 1, **(args or {})},
            }
        )

    def device(self, name: str, major: int, minor: int, memory: int = 40 << 30) -> None:
        """Describe device 0 as Kineto's ``deviceProperties`` does."""
        self.devices.append(
            {
                "id": 0,
                "name": name,
                "computeMajor": major,
                "computeMinor": minor,
                "totalGlobalMem": memory,
                "numSms": 108,
            }
        )

    def launch(
        self,
        call: tuple[float, float],
        gpu: tuple[float, float] | None,
        kernel: str = "k",
        tid: int = 1,
        stream: int = 7,
        cat: str = "kernel",
        api: str = "cudaLaunchKernel",
    ) -> int:
        """A runtime call at ``call = (ts, dur)`` and, unless None, its GPU activity."""
        self.corr += 1
        c = self.corr
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": api,
                "pid": 1,
                "tid": tid,
                "ts": call[0],
                "dur": call[1],
                "args": {"correlation": c},
            }
        )
        if gpu is not None:
            args = {"device": 0, "stream": stream, "correlation": c}
            if cat == "kernel":
                args.update(grid=[1, 1, 1], block=[128, 1, 1])
            else:
                args["bytes"] = 4096
            self.events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": kernel,
                    "pid": 0,
                    "tid": stream,
                    "ts": gpu[0],
                    "dur": gpu[1],
                    "args": args,
                }
            )
        return c

    def write(self, path: Path) -> Path:
        doc = {"schemaVersion": 1, "traceEvents": self.events}
        if self.devices:
            doc["deviceProperties"] = self.devices
        path.write_text(json.dumps(doc))
        return path
