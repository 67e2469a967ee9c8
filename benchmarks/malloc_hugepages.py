"""CPU training with and without transparent huge pages for malloc (glibc's `glibc.malloc.hugetlb=1` tunable).

    .venv/bin/python benchmarks/malloc_hugepages.py --out=benchmarks/malloc-hugepages-cpu.json

XLA:CPU allocates a step's buffers with malloc and frees them after it; glibc hands the large ones back to the
kernel, so every step touches fresh 4 KiB pages again (minor page faults, system time). With the tunable, glibc
asks for transparent huge pages (madvise) and a step faults in 2 MiB at a time. Runs the ListOps demo model
(`lra_flax/configs/listops.py:demo`, batch 32, one Eigen thread as in the test suite) for `--steps` steps,
alternating the two settings `--repeats` times, and records each run's training wall time (results.json), its
user and system CPU time and its minor page faults. Linux with glibc ≥ 2.35 only; elsewhere the tunable is ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def run_once(workdir: Path, data_dir: Path, steps: int, hugepages: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false", ZOO_CPU_PEAK_TFLOPS="0.1")
    if hugepages:
        env["GLIBC_TUNABLES"] = TUNABLE
    command = [
        sys.executable,
        "-m",
        "lra_flax",
        "--config=lra_flax/configs/listops.py:demo",
        f"--workdir={workdir}",
        f"--config.data.dir={data_dir}",
        "--config.data.generator.num_train=3000",
        "--config.data.generator.num_test=500",
        "--config.data.generator.num_valid=100",
        f"--config.train.steps={steps}",
        "--config.train.warmup_steps=24",
        "--config.train.batch_size=32",
        "--config.train.eval_every=0",
        f"--config.train.checkpoint_every={steps}",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=Path(__file__).parents[1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    results = json.loads((workdir / "results.json").read_text())
    return {
        "hugepages": hugepages,
        "train_wall_time_s": results["train_wall_time_s"],
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or platform.libc_ver()[0] != "glibc":
        sys.exit("malloc_hugepages: needs Linux with glibc and transparent huge pages")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for hugepages in (False, True):
                workdir = Path(tmp) / f"run{repeat}-{int(hugepages)}"
                runs.append(run_once(workdir, Path(tmp) / "data", args.steps, hugepages))
                print(json.dumps(runs[-1]), flush=True)

    def mean(hugepages: bool, field: str) -> float:
        values = [r[field] for r in runs if r["hugepages"] == hugepages]
        return sum(values) / len(values)

    fields = ("train_wall_time_s", "user_s", "system_s", "minor_page_faults")
    summary = {f: {"without": mean(False, f), "with": mean(True, f)} for f in fields}
    record = {
        "device": f"cpu: {_cpu_model()}, {os.cpu_count()} cores",
        "glibc": " ".join(platform.libc_ver()),
        "transparent_hugepage": thp.read_text().strip(),
        "command": " ".join(sys.argv),
        "steps": args.steps,
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
