"""Run metrics: `metrics.jsonl`, TensorBoard events, a progress bar on a terminal, log lines elsewhere."""

from __future__ import annotations

import io
import json
import math
import os
import time
import uuid
from collections.abc import Callable

from etils import epath
from tensorboardX import SummaryWriter, record_writer

from zoo.files import as_path, atomic_write_bytes, is_url


def summarise(sums: dict[str, float]) -> dict[str, float]:
    """Metric sums → means (`x / count`); `correct` → `accuracy`, `log_perplexity` → `perplexity` = exp(mean),
    per-class `predictions` → `top_prediction_share` (the most frequent prediction's share)."""
    count = max(sums.get("count", 0.0), 1.0)
    out = {}
    for k, v in sums.items():
        if k == "count":
            continue
        if k == "predictions":
            out["top_prediction_share"] = float(max(v)) / count
        elif k == "log_perplexity":
            out["perplexity"] = math.exp(min(v / count, 700.0))  # capped: exp overflows a float past ~709
        else:
            out["accuracy" if k == "correct" else k] = v / count
    return out


class _UrlEventFile:
    """A TensorBoard event file at a URL, written through epath. Object stores cannot append, so each flush
    uploads the whole file (as tensorboardX's own gs:// writer does); event files stay small."""

    def __init__(self, path: str):
        self.path = epath.Path(path)
        self.buffer = io.BytesIO()
        self.write = self.buffer.write

    def flush(self) -> None:
        self.path.write_bytes(self.buffer.getvalue())

    close = flush


class _UrlEventFiles:
    """tensorboardX's writer factory interface (`open`, `directory_check`) for one URL scheme."""

    def open(self, path: str) -> _UrlEventFile:
        return _UrlEventFile(path)

    def directory_check(self, path: str) -> None:
        epath.Path(path).mkdir(parents=True, exist_ok=True)


def _event_writer(logdir: epath.Path, purge_step: int) -> SummaryWriter:
    """A SummaryWriter for `logdir`, local or a URL; a URL's scheme is written through epath (tensorboardX would
    otherwise need boto3 or google-cloud-storage, or take an unknown scheme for a local directory)."""
    if is_url(logdir):
        record_writer.register_writer_factory(str(logdir).split(":", 1)[0], _UrlEventFiles())
    # Event files are named by the second and the host: a run resumed within the same second would write over
    # the last one's (a URL's store replaces an object whole), so each writer's name ends in its own suffix.
    return SummaryWriter(str(logdir), purge_step=purge_step, filename_suffix=f".{uuid.uuid4().hex[:8]}")


def _read_records(path) -> list[tuple[str, dict]]:
    """(line, record) of each line of a metrics file. A last line cut short (the run stopped while appending it)
    is dropped with a note; a bad line before it is an error naming the line."""
    lines = path.read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
            if not (isinstance(record, dict) and isinstance(record.get("step"), int) and "split" in record):
                raise ValueError("not an object with a step and a split")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if number == len(lines):
                print(f"{path}:{number}: a line cut short (the run stopped while writing it) is dropped", flush=True)
                continue
            raise ValueError(f"{path}:{number}: not a metrics record ({e}); fix or delete that line") from None
        out.append((line, record))
    return out


class MetricWriter:
    """Appends one JSON object per logged step and split; mirrors scalars to TensorBoard. Lines past `resume_step`
    are dropped (the resumed run redoes those steps), and at `final_step` the evaluation lines too (a run stopped
    during the final evaluation redoes it). Only the writing process touches files."""

    def __init__(
        self, workdir: str | os.PathLike, *, resume_step: int, final_step: int | None = None, enabled: bool = True
    ):
        self.enabled = enabled
        self.path = as_path(workdir) / "metrics.jsonl"
        self.tb = None
        if not enabled:
            return

        def keep(record: dict) -> bool:
            if record["step"] == resume_step == final_step:
                return record["split"] == "train"
            return record["step"] <= resume_step

        self.lines: list[str] = []
        if self.path.exists():
            self.lines = [line for line, record in _read_records(self.path) if keep(record)]
            self._rewrite()
        elif resume_step > 0:
            print(
                f"{self.path} is missing: the run resumes at step {resume_step} and the file holds the steps after it "
                "only (TensorBoard's events keep the earlier ones)",
                flush=True,
            )
        self.tb = _event_writer(as_path(workdir) / "tensorboard", purge_step=resume_step + 1)

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "split": split, **{k: float(v) for k, v in metrics.items()}}
        self.lines.append(json.dumps(record))
        if is_url(self.path):  # object stores cannot append: the whole file each time (it stays small)
            self._rewrite()
        else:
            with self.path.open("a") as f:
                f.write(self.lines[-1] + "\n")
        for k, v in metrics.items():
            self.tb.add_scalar(f"{split}/{k}", float(v), int(step))
        self.tb.flush()

    def _rewrite(self) -> None:
        atomic_write_bytes(self.path, "".join(line + "\n" for line in self.lines).encode())

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


# Metrics that depend on wall time (or on the peak measured at start-up): they differ between runs that are
# otherwise identical, so comparisons of runs (resume equals uninterrupted) leave them out.
TIMING_METRICS = frozenset({"steps_per_sec", "tokens_per_sec", "input_wait_fraction", "tflops_per_s_per_device", "mfu"})


class Stopwatch:
    """Wall time and throughput between log points.

    `remeasure` (a peak measured on this host): called when an interval's MFU exceeds 1 (at most once per
    REMEASURE_EVERY_S, its time left out of the run's), it returns the peak per device measured again (FLOP/s); the
    better is kept, and one that is no higher ends the remeasuring. A peak from `peak_source` (a table, a field,
    the environment) that a run exceeds is said once."""

    REMEASURE_EVERY_S = 60.0

    def __init__(
        self,
        peak_flops_per_s: float = 0.0,
        devices: int = 1,
        remeasure: Callable[[], float] | None = None,
        peak_source: str = "",
    ):
        self.start = self.last = time.perf_counter()
        self.steps, self.tokens, self.flops, self.waiting = 0, 0, 0.0, 0.0
        self.peak_flops_per_s, self.devices = peak_flops_per_s, devices  # of one device; 0: unknown
        self.total_flops = 0.0  # every step since the start
        self.remeasure, self.remeasured_at = remeasure, -math.inf
        self.peak_source = peak_source  # emptied once a run exceeding it has been said

    def tick(self, tokens: int, flops: float = 0.0) -> None:
        self.steps += 1
        self.tokens += tokens
        self.flops += flops
        self.total_flops += flops

    def utilisation(self, flops: float, seconds: float) -> dict[str, float]:
        """TFLOP/s per device and MFU (model FLOPs over the devices' peak) of `flops` done in `seconds`."""
        per_device = flops / max(seconds, 1e-9) / self.devices
        out = {"tflops_per_s_per_device": per_device / 1e12}
        if self.peak_flops_per_s:
            out["mfu"] = per_device / self.peak_flops_per_s
        return out

    def waited(self, seconds: float) -> None:
        """Time spent waiting for the next input batch (the rest is the step and the loop's own work)."""
        self.waiting += seconds

    def rates(self) -> dict[str, float]:
        """Throughput since the last call, and the share of that wall time spent waiting for input: near 1
        the run is input-bound (more data workers, a cache), near 0 it is compute-bound."""
        now = time.perf_counter()
        dt = max(now - self.last, 1e-9)
        out = {
            "steps_per_sec": self.steps / dt,
            "tokens_per_sec": self.tokens / dt,
            "input_wait_fraction": min(self.waiting / dt, 1.0),
        }
        if self.flops:
            out["model_flops_per_step"] = self.flops / max(self.steps, 1)
            out.update(self.utilisation(self.flops, dt))
            if out.get("mfu", 0.0) > 1 and self.remeasure and now - self.remeasured_at >= self.REMEASURE_EVERY_S:
                measured = self.remeasure()
                if measured <= self.peak_flops_per_s:  # the peak was not the cause: measuring again will not help
                    self.remeasure = None
                self.peak_flops_per_s = max(self.peak_flops_per_s, measured)
                spent = time.perf_counter() - now
                self.start += spent  # the measurement is not the run's time
                now += spent
                self.remeasured_at = now
                out.update(self.utilisation(self.flops, dt))
            elif out.get("mfu", 0.0) > 1 and not self.remeasure and self.peak_source:
                print(
                    f"MFU came out at {100 * out['mfu']:.3g}%: the peak of {self.peak_flops_per_s / 1e12:.3g} TFLOP/s "
                    f"per device ({self.peak_source}) is below what this run does, so its MFU figures are not "
                    "meaningful; set train.peak_tflops_per_device to the device's real peak",
                    flush=True,
                )
                self.peak_source = ""
        self.last, self.steps, self.tokens, self.flops, self.waiting = now, 0, 0, 0.0, 0.0
        return out

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
