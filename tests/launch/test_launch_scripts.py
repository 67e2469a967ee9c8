"""launch/: shellcheck-clean, argument handling, and the exact commands a dry run prints."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    "launch/gpu_node.sh",
    "launch/tpu_pod.sh",
    "launch/slurm.sbatch",
    "launch/common.sh",
    "benchmarks/gpu/session.sh",
]


def _bash(*args, env=None):
    import os

    return subprocess.run(
        ["bash", *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60
    )


def test_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or str(Path(__import__("sys").executable).with_name("shellcheck"))
    run = subprocess.run([shellcheck, "-x", *SCRIPTS], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_gpu_node_dry_run():
    run = _bash("launch/gpu_node.sh", "--dry-run", "--gpus", "0,1", "--", "lra-train", "--workdir=runs/a b")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "+ export CUDA_VISIBLE_DEVICES=0,1" in lines
    assert any("--xla_gpu_enable_latency_hiding_scheduler=true" in line for line in lines)
    assert lines[-1] == r"+ lra-train --workdir=runs/a\ b"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dry-run"], "no command given; put it after --"),
        (["--frobnicate", "--", "x"], "unknown option '--frobnicate'"),
        (["--gpus", "a,b", "--", "x"], "--gpus must look like 0,1,2,3"),
        (["--gpus"], "--gpus needs a value"),
    ],
)
def test_gpu_node_bad_arguments(args, message):
    run = _bash("launch/gpu_node.sh", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_tpu_pod_dry_run_generates_every_step():
    run = _bash(
        "launch/tpu_pod.sh", "--dry-run", "--name", "zoo-pod", "--zone", "us-west4-a", "--project", "p1",
        "--spot", "--workers", "2", "--logs", "out/logs", "--", "lra-train", "--workdir=gs://b/r",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("+ ")]
    gc = "+ gcloud compute tpus tpu-vm"
    assert lines[0] == (
        f"{gc} create zoo-pod --zone=us-west4-a --project=p1 --accelerator-type=v5litepod-16 "
        "--version=tpu-ubuntu2204-base --spot"
    )
    assert lines[1].startswith("+ git -C ") and "archive --format=tar.gz" in lines[1]
    assert lines[2].startswith(f"{gc} scp ") and lines[2].endswith("--zone=us-west4-a --project=p1 --worker=all")
    assert lines[3].startswith(f"{gc} ssh zoo-pod") and r"pip\ install\ -q\ -e\ \".\[tpu\]\"" in lines[3]
    assert lines[4].startswith(f"{gc} ssh zoo-pod") and r"lra-train\ --workdir=gs://b/r" in lines[4]
    assert "--worker=all" in lines[4]
    assert lines[5] == "+ mkdir -p out/logs"
    assert lines[6].endswith("out/logs/worker-0.log --zone=us-west4-a --project=p1 --worker=0")
    assert lines[7].endswith("out/logs/worker-1.log --zone=us-west4-a --project=p1 --worker=1")
    assert len(lines) == 8


def test_tpu_pod_skips():
    run = _bash(
        "launch/tpu_pod.sh", "--dry-run", "--name", "p", "--zone", "z", "--skip-create", "--skip-install", "--", "x"
    )
    assert run.returncode == 0, run.stderr
    commands = [line for line in run.stdout.splitlines() if line.startswith("+ ")]
    assert not any(" create " in c or " archive " in c or "pip" in c for c in commands)
    assert commands[0].startswith("+ gcloud compute tpus tpu-vm ssh p --zone=z --worker=all")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--zone", "z", "--", "x"], "--name is required"),
        (["--name", "p", "--", "x"], "--zone is required"),
        (["--name", "p", "--zone", "z"], "no command given"),
        (["--name", "Bad_Name", "--zone", "z", "--", "x"], "--name must be lower-case"),
        (["--name", "p", "--zone", "z", "--workers", "0", "--", "x"], "--workers needs a positive number"),
    ],
)
def test_tpu_pod_bad_arguments(args, message):
    run = _bash("launch/tpu_pod.sh", "--dry-run", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_slurm_dry_run_and_guards():
    run = _bash("launch/slurm.sbatch", "lra-train", "--workdir=/shared/x", env={"DRY_RUN": "1"})
    assert run.returncode == 0, run.stderr
    assert (
        run.stdout.splitlines()[-1] == "+ srun --kill-on-bad-exit=1 --ntasks-per-node=1 lra-train --workdir=/shared/x"
    )
    no_cmd = _bash("launch/slurm.sbatch", env={"DRY_RUN": "1"})
    assert no_cmd.returncode == 2 and "no command given" in no_cmd.stderr
    outside = _bash("launch/slurm.sbatch", "lra-train", env={"DRY_RUN": "0", "SLURM_JOB_ID": ""})
    assert outside.returncode == 2 and "not inside a SLURM job" in outside.stderr
    header = (ROOT / "launch/slurm.sbatch").read_text()
    for directive in ("--ntasks-per-node=1", "--requeue", "--signal=TERM@300"):
        assert f"#SBATCH {directive}" in header


@pytest.mark.parametrize("script, first", [("launch/gpu_node.sh", "One host"), ("launch/tpu_pod.sh", "A Cloud TPU")])
def test_help_prints_the_header_only(script, first):
    run = _bash(script, "--help")
    assert run.returncode == 0 and run.stdout.startswith(first), run.stdout
    assert "set -euo" not in run.stdout
