"""Progress of long work: a tqdm bar on a terminal; elsewhere (CI, batch jobs, log files) plain lines.

`WorkProgress` (data generation, caching, decoding): a line every `every_s` seconds with its rate, and a closing
line. `StepProgress` (the train loop): a line per logged interval with its metrics (steps/s, tokens/s, MFU).
"""

from __future__ import annotations

import math
import sys
import time

from tqdm import tqdm


def _bar(stream, *, enabled: bool = True, **tqdm_args) -> tqdm:
    """A tqdm bar on `stream`, shown only on a terminal (tqdm's disable=None) and when `enabled`: elsewhere the
    callers print plain lines."""
    return tqdm(file=stream, dynamic_ncols=True, disable=None if enabled else True, **tqdm_args)


class WorkProgress:
    def __init__(self, desc: str, *, total: int | None = None, unit: str = "it", every_s: float = 30.0, stream=None):
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.stream = stream or sys.stderr
        self.count = 0
        self.printed: int | None = None  # the count of the last line printed
        self.start = self.last = time.perf_counter()
        self.bar = _bar(self.stream, total=total, desc=desc, unit=unit)

    def update(self, n: int = 1) -> None:
        self.count += n
        if not self.bar.disable:
            self.bar.update(n)
        elif time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            self._print()

    def _print(self) -> None:
        self.printed = self.count
        elapsed = time.perf_counter() - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        done = f"{self.count:,}" + (f"/{self.total:,}" if self.total else "")
        eta = f", {(self.total - self.count) / rate:.0f} s left" if self.total and rate > 0 else ""
        line = f"{self.desc}: {done} {self.unit} in {elapsed:.0f} s ({rate:,.1f} {self.unit}/s{eta})"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()
        if self.printed != self.count:  # the last interval's line may already say it all
            self._print()

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StepProgress:
    """A tqdm bar on a terminal (steps/s, tokens/s, loss); a log line per call to `log` elsewhere."""

    def __init__(self, total: int, initial: int, *, enabled: bool = True):
        self.enabled = enabled
        self.bar = _bar(sys.stderr, enabled=enabled, total=total, initial=initial, unit="step")
        self.interactive = not self.bar.disable
        self.total = total

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def log(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        shown = {k: f"{v:.4g}" if isinstance(v, float) and not math.isnan(v) else v for k, v in metrics.items()}
        line = f"[{split}] step {step}/{self.total} " + " ".join(f"{k}={v}" for k, v in shown.items())
        if self.interactive:
            self.bar.set_postfix_str(
                f"loss={metrics.get('loss', float('nan')):.3f} "
                f"{metrics.get('steps_per_sec', 0):.2f} steps/s {metrics.get('tokens_per_sec', 0):.0f} tok/s"
                + (f" MFU {100 * metrics['mfu']:.1f}%" if "mfu" in metrics else "")
                if split == "train"
                else self.bar.postfix or ""
            )
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self.bar.close()
