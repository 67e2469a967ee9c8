"""Progress of long work outside the train loop (data generation, caching): a tqdm bar on a terminal, a log
line every `every_s` seconds elsewhere (CI, batch jobs), each with its rate; a closing line either way."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class WorkProgress:
    def __init__(self, desc: str, *, total: int | None = None, unit: str = "it", every_s: float = 30.0, stream=None):
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.stream = stream or sys.stderr
        self.count = 0
        self.start = self.last = time.perf_counter()
        interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(
            total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, disable=not interactive
        )

    def _line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        done = f"{self.count:,}" + (f"/{self.total:,}" if self.total else "")
        eta = f", {(self.total - self.count) / rate:.0f} s left" if self.total and rate > 0 else ""
        return f"{self.desc}: {done} {self.unit} in {elapsed:.0f} s ({rate:,.1f} {self.unit}/s{eta})"

    def update(self, n: int = 1) -> None:
        self.count += n
        if not self.bar.disable:
            self.bar.update(n)
        elif time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            print(self._line(), file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()
        print(self._line(), file=self.stream, flush=True)

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
