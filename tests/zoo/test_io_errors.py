"""I/O problems are one line naming the path and the problem, exit status 2, before any work; --help lists
each command's own flags; --debug shows the traceback."""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from zoo import config_fields
from zoo.training.config import check_output_dir, check_output_file
from zoo.training.data import DataFormatError, read_utf8_lines


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


def test_a_workdir_s_damaged_or_foreign_config_json_is_named(tmp_path):
    from mlm_flax.finetune_task import pretrained_run
    from mt_flax.task import load_run  # not mt_flax.translate: its absl flags would clash in this process
    from zoo.models import model_config
    from zoo.training import train_config
    from zoo.training.config import check_resume_config

    (tmp_path / "results.json").write_text("{}")  # a run with output: its config.json is compared, not replaced
    (tmp_path / "config.json").write_text('{"seed": 0, "train": {"st')  # cut short
    config = ml_collections.ConfigDict({"seed": 0, "train": train_config(), "model": model_config()})
    with pytest.raises(ValueError, match=r"config.json: not a readable JSON file .*a damaged workdir"):
        check_resume_config(config, tmp_path)
    with pytest.raises(ValueError, match=r"config.json: not a readable JSON file"):
        load_run(tmp_path)
    # Another command's run: named as such, not a KeyError from deep inside.
    (tmp_path / "config.json").write_text('{"task": "listops"}')
    with pytest.raises(ValueError, match=r"is a 'listops' run; mt-translate reads mt-train runs"):
        load_run(tmp_path)
    # Resuming it with another command's config: one line naming its kind, not a diff of every field.
    config.task = "translation"
    with pytest.raises(ValueError, match=rf"^{tmp_path} is a 'listops' run; use a new --workdir\. Nothing in the"):
        check_resume_config(config, tmp_path)
    (tmp_path / "config.json").write_text('{"task": "translation"}')
    for name in ("spm.model", "checkpoints"):
        (tmp_path / name).mkdir()
    finetune = ml_collections.ConfigDict({"pretrained": {"workdir": str(tmp_path)}})
    with pytest.raises(ValueError, match=r"is a 'translation' run; fine-tuning starts from an mlm-train run"):
        pretrained_run(finetune)


def test_a_run_s_config_is_read_with_its_model_fields_completed(tmp_path):
    from zoo.models import model_config
    from zoo.training.config import read_run_config

    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/config.json does not exist; the reader reads runs"):
        read_run_config(tmp_path, reader="the reader reads runs")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=rf"^{tmp_path}/afile is a file, not a run's folder; the reader reads runs"):
        read_run_config(tmp_path / "afile", reader="the reader reads runs")
    # A run written before most model fields existed: they come back at their defaults, the recorded ones kept.
    (tmp_path / "config.json").write_text('{"task": "listops", "model": {"mixer": "linear", "d_model": 24}}')
    config = read_run_config(tmp_path, reader="the reader reads runs", tasks=("listops", "text"))
    assert config.model.mixer == "linear" and config.model.d_model == 24
    assert config.model.num_layers == model_config().num_layers
    with pytest.raises(ValueError, match=r"config.json is a 'listops' run; the reader reads runs"):
        read_run_config(tmp_path, reader="the reader reads runs", tasks=("translation",))


def test_output_dir_checks(tmp_path, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=rf"--workdir={a_file} exists and is not a directory"):
        check_output_dir(a_file, "--workdir")
    with pytest.raises(ValueError, match=rf"--workdir={a_file}/run/deeper: {a_file} is a file, not a directory"):
        check_output_dir(a_file / "run" / "deeper", "--workdir")
    check_output_dir(tmp_path / "new" / "run", "--workdir")  # creatable
    check_output_dir(tmp_path, "--workdir")  # exists, writable
    assert not (tmp_path / "new").exists()  # a check, not a mkdir
    # Not writable (root bypasses permissions, so the answer of os.access is what is set here).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match=rf"--workdir={tmp_path} is not writable"):
        check_output_dir(tmp_path, "--workdir")
    with pytest.raises(ValueError, match=rf"cannot be created: {tmp_path} is not writable"):
        check_output_dir(tmp_path / "new", "--workdir")


def test_an_output_file_this_process_cannot_overwrite_is_refused_before_the_work(tmp_path, monkeypatch):
    figure = tmp_path / "figure.png"
    check_output_file(figure, "--output", (".png",))  # new file in a writable folder
    figure.write_bytes(b"an earlier figure")
    check_output_file(figure, "--output", (".png",))  # an existing file is overwritten
    read_only = str(figure)  # root bypasses permissions: os.access answers as for a read-only file
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != read_only)
    with pytest.raises(ValueError, match=rf"--output={figure} exists and this process cannot overwrite it"):
        check_output_file(figure, "--output", (".png",))


def test_a_cache_directory_the_run_cannot_write_is_a_config_problem(tmp_path, monkeypatch):
    from mt_flax.configs import translation
    from zoo.training.validate import config_problems

    config = translation.get_config("tiny")
    config.data.update(source="text", dir=str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    assert config_problems(config, translation.CONFIG_SECTIONS) == []
    read_only = str(tmp_path / "shared")  # root bypasses permissions: os.access answers as a read-only mount would
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != read_only)
    (problem,) = config_problems(config, translation.CONFIG_SECTIONS)
    assert problem.startswith(f"data.dir={read_only} is not writable") and "set data.cache_dir" in problem
    config.data.cache_dir = str(tmp_path / "cache")  # the way out: caches elsewhere
    assert config_problems(config, translation.CONFIG_SECTIONS) == []
    config.data.cache_dir = read_only
    (problem,) = config_problems(config, translation.CONFIG_SECTIONS)
    assert problem.startswith(f"data.cache_dir={read_only} is not writable")


def test_utf8_lines_name_file_and_line(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"one\r\ntwo\n\nfa\xe7ade\n")
    with pytest.raises(DataFormatError, match=rf"{path}:4: not valid UTF-8 \(byte 3 of the line: invalid"):
        read_utf8_lines(path)
    path.write_bytes(b"one\r\ntwo\n\nfour")
    assert read_utf8_lines(path) == ["one", "two", "", "four"]
    with pytest.raises(DataFormatError, match=rf"{tmp_path} is a directory, not a text file"):
        read_utf8_lines(tmp_path)


LISTOPS = "--config=lra_flax/configs/listops.py:demo"


@pytest.mark.parametrize(
    "args, message",
    [
        (["lra_flax", LISTOPS, "--workdir={file}"], "--workdir={file} exists and is not a directory"),
        (["lra_flax", LISTOPS, "--workdir={file}/run"], "{file} is a file, not a directory"),
        (["lra_flax", "--config=lra_flax/configs/nope.py:demo", "--workdir={tmp}/run"], "no config file 'lra_flax/co"),
        (["mt_flax", "--config={file}", "--workdir={tmp}/run"], "{file}:1: NameError: name 'x' is not defined"),
        (
            ["mt_flax", "--config=mlm_flax/configs/pretrain.py:gmlp_tiny", "--workdir={tmp}/run"],
            "--config is not a config for mt-train: it has no data.bible_books.train, ",
        ),
        (
            ["mlm_flax.finetune", "--config=mlm_flax/configs/pretrain.py:gmlp_tiny", "--workdir={tmp}/run"],
            "--config is not a config for mlm-finetune: it has no pretrained.workdir, ",
        ),
        (["lra_flax.data_cli", "listops", "--output_dir={file}"], "--output_dir={file} exists and is not a directory"),
        (["mt_flax.data_cli", "bible", "--output_dir={file}/out"], "{file} is a file, not a directory"),
        (["mlm_flax.data_cli", "kjv", "--output_dir={file}"], "--output_dir={file} exists and is not a directory"),
    ],
)
def test_cli_io_errors_are_one_line_and_exit_2(tmp_path, args, message):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    run = _cli(*(a.format(file=a_file, tmp=tmp_path) for a in args))
    assert run.returncode == 2, run.stderr[-2000:]
    assert message.format(file=a_file) in run.stderr and "Traceback" not in run.stderr
    assert len([line for line in run.stderr.splitlines() if "error:" in line]) == 1
    assert not (tmp_path / "run").exists()


def test_a_config_file_that_does_not_parse_is_its_line(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text("import ml_collections\n\ndef get_config(:\n    pass\n")
    run = _cli("mt_flax", f"--config={config}", f"--workdir={tmp_path / 'run'}")
    assert run.returncode == 2 and run.stderr.strip() == f"mt-train: error: {config}:3: invalid syntax", run.stderr


def test_debug_shows_the_traceback(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    run = _cli("lra_flax", LISTOPS, f"--workdir={a_file}", "--debug")
    assert run.returncode != 0 and "Traceback" in run.stderr and "exists and is not a directory" in run.stderr


_TRAINING_CONFIGS = {
    "lra_flax": [m.__name__ for m in config_fields.package_config_modules("lra_flax.configs")],
    "mt_flax": ["mt_flax.configs.translation"],
    "mlm_flax": ["mlm_flax.configs.pretrain"],
    "mlm_flax.finetune": ["mlm_flax.configs.finetune"],
}


@pytest.mark.parametrize(
    "module, own_flags",
    [
        ("lra_flax", ["--config", "--workdir", "--plan_memory", "--debug", "--num_processes"]),
        ("mt_flax", ["--config", "--workdir", "--plan_memory", "--profile_steps", "--fake_cpu_devices"]),
        ("mlm_flax", ["--config", "--workdir", "--plan_memory", "--heartbeat_timeout_s"]),
        ("mlm_flax.finetune", ["--config", "--workdir", "--plan_memory", "--coordinator_address"]),
        ("mt_flax.translate", ["--workdir", "--input", "--output", "--beam_size", "--length_penalty"]),
        ("mlm_flax.data_cli", ["--output_dir", "--wheel_cache", "--holdout_fraction", "--overwrite"]),
        ("lra_flax.data_cli", ["--output_dir", "--num_train", "--resolution", "--difficulty", "--overwrite"]),
        ("lra_flax.compare_cli", ["--config", "--workdir", "--cells", "--shard", "--retry_failed", "--report_only"]),
        ("lra_flax.pathfinder_figure", ["--output", "--per_label", "--seed"]),
    ],
)
def test_help_lists_the_commands_own_flags(module, own_flags):
    run = _cli(module, "--help")
    assert run.returncode == 0, run.stderr[-2000:]
    for flag in own_flags:  # booleans read --[no]name
        assert f"{flag}:" in run.stdout or flag.replace("--", "--[no]") + ":" in run.stdout, (flag, run.stdout[:2000])
    # a training command's help also lists every field its config files declare for themselves (data, ...)
    for config_module in _TRAINING_CONFIGS.get(module, ()):
        path = config_module.replace(".", "/") + ".py"
        assert f"Config fields of {path} only:" in run.stdout, path
        for section, fields in importlib.import_module(config_module).CONFIG_SECTIONS.items():
            for name, _ in config_fields.flat(fields, section):
                assert f"  {name} (" in run.stdout.split(f"{path} only:")[1], (path, name)
    if module not in _TRAINING_CONFIGS:  # a training command's flags are not offered where nothing trains
        assert "--profile_steps" not in run.stdout and "--plan_memory" not in run.stdout
    usage = run.stdout.split("flags:")[0]
    assert "--helpfull" not in usage  # the usage text comes first, from the command's own docstring
    assert "--workdir" in usage or "--output" in usage, usage


def test_a_missing_optional_dependency_names_its_extra(monkeypatch):
    """matplotlib and tensorflow-datasets are extras: without them, the commands that need them say which."""
    import sys

    from zoo.plots import MissingExtra, pyplot
    from zoo.training.data import open_tfds

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` does when not installed
    with pytest.raises(MissingExtra, match=r"pip install 'relu-linear-gmlp-zoo\[plots\]'"):
        pyplot()
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(FileNotFoundError, match=r"needs tensorflow-datasets.*'\.\[tfds\]'.*or use data.source='x'"):
        open_tfds("imdb_reviews", "train", None, "data.source='x'")


@pytest.mark.parametrize("script, own_flag", [("lra-compare", "--cells"), ("mt-translate", "--beam_size")])
def test_an_installed_command_s_help_lists_its_own_flags(script, own_flag):
    """A console script's `__main__` is the script pip wrote, not the command's module: absl lists a module's flags
    for `--help` only when they are made key flags of the script (`cli.show_command_flags`)."""
    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == script]
    launcher = f"import sys; from {entry.module} import {entry.attr} as run; sys.argv[0] = {script!r}; run()"
    help_text = subprocess.run(
        [sys.executable, "-c", launcher, "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    listed = f"{own_flag}:" in help_text or own_flag.replace("--", "--[no]") + ":" in help_text
    assert listed and "--helpfull" not in help_text.split("flags:")[0], help_text[:2000]


def test_a_metrics_file_s_cut_short_last_line_is_dropped_on_resume_and_a_bad_earlier_one_named(tmp_path, capsys):
    from zoo.training.metrics import MetricWriter

    good = [{"step": s, "split": "train", "loss": 1.0 / s} for s in (2, 4, 6)]
    text = "".join(json.dumps(r) + "\n" for r in good)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 8, "split": "tr')  # the append a kill cut short
    writer = MetricWriter(tmp_path, resume_step=4)
    writer.close()
    assert "metrics.jsonl:4: a line cut short (the run stopped while writing it) is dropped" in capsys.readouterr().out
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == good[:2]
    for bad in (b"garbage\n", b'{"step": 5, "split": "train", "loss": 1.0}\xff\n', b"[1, 2]\n"):
        (tmp_path / "metrics.jsonl").write_bytes(text.encode()[: len(json.dumps(good[0])) + 1] + bad + b"{}\n")
        with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record \(.*\); fix or delete that line"):
            MetricWriter(tmp_path, resume_step=4)


def test_a_missing_metrics_file_on_resume_is_said(tmp_path, capsys):
    from zoo.training.metrics import MetricWriter

    MetricWriter(tmp_path, resume_step=0).close()  # a fresh run: nothing to say
    assert "is missing" not in capsys.readouterr().out
    MetricWriter(tmp_path / "resumed", resume_step=40).close()
    assert "metrics.jsonl is missing: the run resumes at step 40" in capsys.readouterr().out


def test_json_records_of_the_wrong_shape_are_named(tmp_path):
    from lra_flax import generator_record
    from zoo.models import model_config
    from zoo.training.config import check_resume_config

    (tmp_path / "generator.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"generator.json is not a generator record \(a JSON object\): move it away"):
        generator_record.read(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    (tmp_path / "results.json").write_text("{}")  # a run with output: its config.json is compared
    config = ml_collections.ConfigDict({"model": model_config()})
    with pytest.raises(ValueError, match=r"config.json: not a config \(a JSON object\); restore the file"):
        check_resume_config(config, tmp_path)
