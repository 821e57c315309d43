"""Command lines refuse a bad value up front: one line on stderr naming the option, the value and the
fix, exit status 2, no traceback, and no run started (issue 13, item 6)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli, env, runner
from tools import calibrate_memory

ROOT = Path(__file__).resolve().parent.parent


def _command(args, tmp_path, module=("-m", "helpers", "bench")):
    """Run a real command line with its temporary files under tmp_path/tmp; return (done, kit_bench_ dirs)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    child = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *module, *args], capture_output=True, text=True, cwd=ROOT, env=child,
                          timeout=300)
    return done, sorted(p.name for p in tmp.glob("kit_bench_*"))


def _assert_one_line_refusal(done, prog, *named):
    lines = done.stderr.splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-1500:])
    assert len(lines) == 1 and lines[0].strip(), done.stderr
    assert lines[0].startswith(f"{prog}: "), lines[0]
    for text in named:
        assert text in lines[0], (text, lines[0])
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


@pytest.fixture
def no_runs(monkeypatch):
    """A command line may parse and check, but never start a run."""

    def refuse(*args, **kwargs):
        pytest.fail("a run was started for a command line that should have been refused")

    monkeypatch.setattr(runner, "measure", refuse)
    monkeypatch.setattr(runner, "run", refuse)
    monkeypatch.setattr(runner, "_run_once", refuse)
    monkeypatch.setattr(runner, "run_matrix", refuse)


def _refused_in_process(capsys, argv, main=cli.bench_command):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, (exit_.value.code, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err, err
    return err.strip()


BAD_BENCH = [
    (["--stage", "5"], "bench: --stage 5: choose 0, 1, 2 or 3"),
    (["--stage", "two"], "bench: --stage 'two': choose 0, 1, 2 or 3"),
    (["--shape", "nosuch"], "bench: --shape 'nosuch': unknown; kit shapes: tiny, mini, gpt2-124m, "),
    (["--micro-batch", "0"], "bench: --micro-batch 0: must be a whole number >= 1"),
    (["--micro-batch", "1.5"], "bench: --micro-batch '1.5': must be a whole number >= 1"),
    (["--world-size", "0"], "bench: --world-size 0: must be a whole number >= 1"),
    (["--steps", "-3"], "bench: --steps -3: must be a whole number >= 1"),
    (["--seq-len", "4"], "bench: --seq-len 4: must be a whole number >= 8"),
    (["--precision", "fp8"], "bench: --precision 'fp8': choose auto, fp16, bf16 or fp32"),
    (["--offload-optimizer", "disk"], "bench: --offload-optimizer 'disk': choose none, cpu or nvme"),
    (["--offload-param", "cpu"], "bench: --offload-param 'cpu': parameter offload needs --stage 3"),
    (["--offload-param", "nvme", "--stage", "1"], "bench: --offload-param 'nvme': parameter offload needs --stage 3"),
    (["--config", "missing.json"], "bench: --config 'missing.json': no such file; give a JSON file or a preset: "),
    (["--only", "stage 0"], "bench: unrecognized arguments: --only stage 0"),
    (["--stage"], "bench: --stage: expected one argument"),
]


@pytest.mark.parametrize("argv,message", BAD_BENCH, ids=[" ".join(a) for a, _ in BAD_BENCH])
def test_bench_refuses_in_one_line_before_any_run(argv, message, capsys, no_runs):
    line = _refused_in_process(capsys, argv)
    assert line.startswith(message), line


@pytest.mark.parametrize("argv,named", [
    (["--stage", "5"], ["--stage 5", "choose 0, 1, 2 or 3"]),
    (["--shape", "nosuch"], ["--shape 'nosuch'", "gpt2-124m"]),
    (["--micro-batch", "0"], ["--micro-batch 0", ">= 1"]),
    (["--config", "missing.json"], ["--config 'missing.json'", "no such file", "zero2"]),
    (["--offload-param", "cpu", "--stage", "2"], ["--offload-param 'cpu'", "--stage 3"]),
    (["--no-such-option"], ["unrecognized arguments: --no-such-option"]),
])
def test_bench_command_line_refuses_in_one_line(argv, named, tmp_path):
    done, started = _command(argv, tmp_path)
    _assert_one_line_refusal(done, "bench", *named)
    assert started == []


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python from the repository root."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_cheap_refusals_import_neither_torch_nor_deepspeed():
    code = ("import sys\nfrom helpers import cli\n"
            "for argv in (['--stage', '5'], ['--shape', 'x'], ['--micro-batch', '0'], ['--config', 'missing.json'],\n"
            "             ['--offload-param', 'cpu']):\n"
            "    try:\n        cli.bench_command(argv)\n    except SystemExit as e:\n        assert e.code == 2, e.code\n"
            "    else:\n        raise AssertionError(argv)\n"
            "print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))\n")
    done = _python(code, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert len(done.stderr.splitlines()) == 5


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_bench_refuses_config_files_that_do_not_load(tmp_path, capsys, no_runs):
    folder = _refused_in_process(capsys, ["--config", str(tmp_path)])
    assert folder.startswith(f"bench: --config {str(tmp_path)!r}: a folder, not a file")
    bad = _write(tmp_path, "bad.json", "{not json")
    line = _refused_in_process(capsys, ["--config", bad])
    assert line.startswith(f"bench: --config {bad!r}: ") and "is not valid JSON" in line
    typo = _write(tmp_path, "typo.json", json.dumps({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
                                                      "fp_16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    line = _refused_in_process(capsys, ["--config", typo])
    assert line.startswith(f"bench: --config {typo!r}: typo.json has 1 error(s): error at fp_16") and "'fp16'" in line
    sized = _write(tmp_path, "sized.json", json.dumps({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
                                                        "gradient_accumulation_steps": 1,
                                                        "zero_optimization": {"stage": 2}}))
    line = _refused_in_process(capsys, ["--config", sized, "--world-size", "2"])
    assert line.startswith(f"bench: --config {sized!r}: with --micro-batch 2 --world-size 2, 1 error(s): "
                           "error at train_batch_size") and "Set train_batch_size to 4" in line


def test_bench_config_errors_on_the_command_line_are_one_line(tmp_path):
    bad = _write(tmp_path, "bad.json", "{not json")
    done, started = _command(["--config", bad], tmp_path)
    _assert_one_line_refusal(done, "bench", f"--config {bad!r}", "not valid JSON")
    two = _write(tmp_path, "two.json", json.dumps({"fp_16": {}, "zero_optimization": {"stage": 1, "offload_param":
                                                                                     {"device": "cpu"}}}))
    done, started_too = _command(["--config", two], tmp_path)  # imports DeepSpeed, which prints; not on stderr here
    _assert_one_line_refusal(done, "bench", f"--config {two!r}", "2 error(s)", "fp_16", "offload_param")
    assert done.stdout == "" and started == started_too == []


def test_world_size_past_the_gpus_is_refused(monkeypatch, capsys, no_runs):
    one_gpu = dataclasses.replace(env.describe(), gpu_name="T4", gpu_count=1)
    monkeypatch.setattr(runner.kit_env, "describe", lambda *a, **k: one_gpu)

    for name, main in (("bench", cli.bench_command), ("matrix", cli.matrix_command)):
        line = _refused_in_process(capsys, ["--world-size", "2"], main=main)
        assert line.startswith(f"{name}: --world-size 2: needs 2 GPUs, this machine has 1: use --world-size 1"), line


def test_matrix_refuses_unknown_rows_in_one_line(tmp_path, capsys, no_runs):
    line = _refused_in_process(capsys, ["--only", "stage 9"], main=cli.matrix_command)
    assert line.startswith("matrix: --only 'stage 9': unknown matrix row(s) 'stage 9'; choose from "), line
    done, started = _command(["--only", "stage 9"], tmp_path, module=("-m", "helpers", "matrix"))
    _assert_one_line_refusal(done, "matrix", "--only 'stage 9'", "unknown matrix row")
    assert started == []


def _fake_measure(seen):
    def measure(spec, log_path=None):
        seen.append(spec)
        return runner.RunResult(label=runner._label(spec.ds_config), status=runner.OK, steps_done=spec.steps,
                               losses=[2.0, 1.0][:spec.steps], median_step_s=0.5)
    return measure


def test_valid_options_pass_validation_and_reach_the_run(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(runner, "measure", _fake_measure(seen))
    argv = ["--shape", "tiny", "--stage", "3", "--offload-param", "cpu", "--offload-optimizer", "cpu", "--steps", "2",
            "--micro-batch", "1", "--seq-len", "8", "--precision", "fp32", "--world-size", "1"]
    assert cli.bench_command(argv) == 0
    out, err = capsys.readouterr()
    assert "Measured runs" in out and "stage 3 + opt->cpu + param->cpu" in out and err == ""
    (spec,) = seen
    assert (spec.shape, spec.steps, spec.micro_batch, spec.seq_len, spec.world_size) == ("tiny", 2, 1, 8, 1)
    zero = spec.ds_config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu" and "fp16" not in spec.ds_config


def test_a_preset_config_reaches_the_run_with_its_autos_filled(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(runner, "measure", _fake_measure(seen))
    assert cli.bench_command(["--config", "zero2", "--micro-batch", "3", "--precision", "fp32", "--json"]) == 0
    out, err = capsys.readouterr()
    assert '"status": "ok"' in out and "Traceback" not in err
    config = seen[0].ds_config
    assert config["train_batch_size"] == 3 and config["train_micro_batch_size_per_gpu"] == 3
    assert config["fp16"]["enabled"] is False and config["bf16"]["enabled"] is False
    assert "auto" not in json.dumps(config)


def test_json_from_a_preset_config_is_clean_json(tmp_path):
    """The real command line, with only the run faked: DeepSpeed's import chatter from the config check
    must not land in front of the JSON."""
    code = ("import sys\nfrom helpers import cli, runner\n"
            "def fake(spec, log_path=None):\n"
            "    return runner.RunResult(label='fake', status=runner.OK, n_params=spec.ds_config['train_batch_size'])\n"
            "runner.measure = fake\n"
            "sys.exit(cli.bench_command(['--config', 'zero2', '--micro-batch', '3', '--json']))\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr[-1500:]
    result = json.loads(done.stdout)
    assert (result["label"], result["status"], result["n_params"]) == ("fake", "ok", 3) and done.stderr == ""


def test_matrix_rows_reach_the_matrix(monkeypatch, capsys):
    seen = {}

    def run_matrix(shape, machine, micro_batch, seq_len, steps, **kw):
        seen.update(shape=shape, micro_batch=micro_batch, seq_len=seq_len, steps=steps, kinds=kw["kinds"])
        return []

    monkeypatch.setattr(runner, "run_matrix", run_matrix)
    monkeypatch.setattr(runner, "rows_table", lambda rows, machine: "matrix table")
    monkeypatch.setattr(runner, "ranks_table", lambda rows: "ranks table")
    only = "stage 0, stage 3 + CPU offload"
    assert cli.matrix_command(["--only", only, "--shape", "mini", "--steps", "1", "--seq-len", "16"]) == 0
    assert seen == {"shape": "mini", "micro_batch": 2, "seq_len": 16, "steps": 1,
                    "kinds": [{"stage": 0}, {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}]}
    assert capsys.readouterr().out.splitlines() == ["matrix table", "ranks table"]


def test_doctor_refuses_unknown_ops_and_options(tmp_path):
    done, _ = _command(["--load", "no_such_op"], tmp_path, module=("-m", "helpers", "doctor"))
    line = _assert_one_line_refusal(done, "doctor", "--load 'no_such_op'", "cpu_adam")
    assert "no such DeepSpeed op" in line and done.stdout == ""
    done, _ = _command(["--prebuild", "--verbose"], tmp_path, module=("-m", "helpers", "doctor"))
    _assert_one_line_refusal(done, "doctor", "unrecognized arguments: --verbose")


@pytest.mark.parametrize("argv,message", [
    (["--shapes", "gpt2-124m", "nosuch"], "calibrate_memory: --shapes 'nosuch': unknown; kit shapes: tiny, "),
    (["--rows", "stage 0", "stage 9"], "calibrate_memory: --rows 'stage 9': unknown; matrix rows: stage 0, "),
    (["--micro-batch", "0"], "calibrate_memory: --micro-batch 0: must be a whole number >= 1"),
    (["--seq-len", "7"], "calibrate_memory: --seq-len 7: must be a whole number >= 8"),
    (["--steps", "none"], "calibrate_memory: --steps 'none': must be a whole number >= 1"),
])
def test_calibrate_memory_refuses_in_one_line(argv, message, tmp_path, capsys, monkeypatch, no_runs):
    monkeypatch.setattr(calibrate_memory.env, "describe", lambda *a, **k: pytest.fail("went past validation"))
    out = tmp_path / "runs.jsonl"
    line = _refused_in_process(capsys, [*argv, "--out", str(out)], main=calibrate_memory.main)
    assert line.startswith(message), line
    assert not out.exists()


def test_calibrate_memory_command_line_refuses_in_one_line(tmp_path):
    done, started = _command(["--shapes", "gpt2-9000b", "--out", str(tmp_path / "x.jsonl")], tmp_path,
                             module=("tools/calibrate_memory.py",))
    _assert_one_line_refusal(done, "calibrate_memory", "--shapes 'gpt2-9000b'", "gpt2-355m")
    assert started == [] and not (tmp_path / "x.jsonl").exists()
    done, _ = _command(["--out", str(tmp_path / "no" / "x.jsonl")], tmp_path, module=("tools/calibrate_memory.py",))
    _assert_one_line_refusal(done, "calibrate_memory", "--out ", "its folder does not exist")


def test_one_line_parser_and_types(capsys):
    parser = cli.OneLineParser(prog="python -m x", name="x")
    parser.add_argument("--n", type=cli.whole_number(3))
    parser.add_argument("--pick", type=cli.one_of(["a", "b"], "letters"))
    parser.add_argument("--level", type=cli.one_of([1, 2]), choices=[1, 2])
    assert vars(parser.parse_args(["--n", "3", "--pick", "b", "--level", "2"])) == {"n": 3, "pick": "b", "level": 2}
    assert "usage: python -m x" in parser.format_usage()
    for argv, message in ((["--n", "2"], "x: --n 2: must be a whole number >= 3\n"),
                          (["--pick", "c"], "x: --pick 'c': unknown; letters: a, b\n"),
                          (["--level", "3"], "x: --level 3: choose 1 or 2\n")):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2 and capsys.readouterr() == ("", message)
    assert cli._rephrase("argument --x: invalid choice: 'q' (choose from 'a', 'b')") == "--x 'q': choose 'a', 'b'"
    assert cli._rephrase("argument --x: invalid int value: 'q'") == "--x 'q': not a valid int"
    assert cli._rephrase("the following arguments are required: --y") == "the following arguments are required: --y"
    assert cli.one_line("a\n\n  b  \nc") == "a b c" and cli.quoted("5") == "5" and cli.quoted("five") == "'five'"
    assert cli.positive_int("7") == 7 and cli.listed([1, 2, 3], " or ") == "1, 2 or 3"


def test_one_line_parser_writes_exactly_its_line(capfd):
    parser = cli.OneLineParser(name="tool")
    parser.add_argument("--n", type=cli.positive_int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "0"])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "tool: --n 0: must be a whole number >= 1\n")


def test_quiet_silences_and_restores_both_file_descriptors(capfd):
    os.write(1, b"before\n")
    with cli.quiet():
        os.write(1, b"hidden out\n")
        os.write(2, b"hidden err\n")
    os.write(1, b"shown out\n")
    os.write(2, b"shown err\n")
    assert capfd.readouterr() == ("before\nshown out\n", "shown err\n")


def test_python_m_helpers_names_its_commands_in_one_line(capsys):
    assert cli.main(["nosuch"]) == 2 and cli.main([]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["python -m helpers: unknown command 'nosuch'; choose bench, matrix, doctor or sizing "
                     "(then --help)",
                     "python -m helpers: no command; choose bench, matrix, doctor or sizing (then --help)"]
    assert sorted(cli.COMMANDS) == ["bench", "doctor", "matrix", "sizing"]
