"""One home for every default: the options records own them and the parser reads them from
there (each module of tuner/cli/ builds its command's record from its defaults), so code
that builds a record directly (the integration tests, a notebook) measures as a user at the
command line does. Each command's options built from an empty command line equal the record
built from its own defaults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuner import cli
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import (
    BenchOptions,
    EngineOptions,
    OptimizeOptions,
    PolicyOptions,
    VerifyOptions,
)


def _parsed(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_bench_from_an_empty_command_line_is_the_records_defaults():
    got = BenchOptions.from_cli_args(_parsed("bench", "--output-dir", "out"))
    want = BenchOptions(workload=WorkloadSpec(name="instructcoder"), engine=EngineOptions(),
                        settings=MeasureSettings(), config=TrialConfig(), out_dir=Path("out"))
    assert got == want


def test_optimize_from_an_empty_command_line_is_the_records_defaults():
    got = OptimizeOptions.from_cli_args(_parsed("optimize"))
    want = OptimizeOptions(workload=WorkloadSpec(name="instructcoder"), engine=EngineOptions(),
                           constraints={"max_tpot_ms": None, "max_ttft_ms": None},
                           aligned_baseline=got.aligned_baseline)
    assert dataclasses.replace(got, objectives=tuple(got.objectives)) == \
        dataclasses.replace(want, objectives=tuple(want.objectives))
    assert got.aligned_baseline.engine_args is None and got.aligned_baseline.env == ()
    with_policy = OptimizeOptions.from_cli_args(_parsed("optimize", "--policy"))
    assert with_policy.policy == PolicyOptions()


def test_verify_from_an_empty_command_line_is_the_records_defaults():
    got = VerifyOptions.from_cli_args(_parsed("verify", "outputs/s"))
    assert got == VerifyOptions(study_dir=Path("outputs/s"))
    assert got.launches == 3 and got.num_prompts is None


def test_a_resolved_engine_keeps_the_options_time_limits():
    spec, options = EngineSpec(model="m"), EngineOptions()
    assert (spec.ready_timeout_s, spec.request_timeout_s, spec.level_timeout_s) == \
        (options.ready_timeout_s, options.request_timeout_s, options.level_timeout_s)
