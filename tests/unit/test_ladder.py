"""tuner.search.ladder: how the policy's runs are keyed, interleaved, repeated and resumed, in
an in-memory Optuna storage with a made-up measurement (no engine, no subprocess)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from study_fakes import fake_level, fake_study, ngram

from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, Workload, WorkloadSpec
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.records.trials import Failure, TrialOutcome
from tuner.search import ladder, optuna_compat
from tuner.tokens import RequestTokens, TokenCapture

LADDER = (1, 4)
BASE = TrialConfig()
A = TrialConfig(speculative_config=ngram(3))
B = TrialConfig(speculative_config=ngram(5))
LINEUP = [("baseline", BASE), ("leader", A), ("leader", B)]


class FakeMeasure:
    """Measures a config at every ladder level with a fixed throughput per config; fails the
    configs in `fail`, and stops like a killed driver (an exception) on call `die_at`."""

    def __init__(self, *, fail: tuple[TrialConfig, ...] = (), die_at: int | None = None,
                 tokens: bytes | None = None) -> None:
        self.calls: list[tuple[str, Path]] = []
        self.fail, self.die_at, self.tokens = fail, die_at, tokens

    def __call__(self, config: TrialConfig, run_dir: Path) -> TrialOutcome:
        self.calls.append((config.label(), run_dir))
        if len(self.calls) == self.die_at:
            raise KeyboardInterrupt  # the driver is killed mid-run
        if config in self.fail:
            return TrialOutcome(failure=Failure(reason="vLLM exited with status 1",
                                                kind="engine_crashed"))
        tput = 100.0 + 10 * (config.k or 0)
        levels = tuple(LevelMetrics.model_validate(fake_level(
            c, output_throughput=tput * c, mean_tpot_ms=1000.0 / tput)) for c in LADDER)
        return TrialOutcome(result=BenchResult(config=config, engine=EngineInfo(start_s=1.0),
                                               levels=levels), tokens=self.tokens)


@pytest.fixture
def said() -> list[str]:
    return []


@pytest.fixture
def campaign(tmp_path: Path, said: list[str]) -> ladder.Campaign:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return ladder.Campaign(
        study=fake_study(concurrencies=LADDER), engine=EngineSpec(model="fake"),
        workload=Workload(spec=WorkloadSpec(name="random"), prompts=()),
        settings=MeasureSettings(concurrencies=LADDER), repeats=2, out_dir=tmp_path,
        say=said.append)


def test_the_schedule_interleaves_the_configs_within_each_repeat():
    plan = ladder.schedule(LINEUP, 2)
    assert [(r.n, r.repeat, r.config) for r in plan] == [
        (1, 0, BASE), (2, 0, A), (3, 0, B), (4, 1, BASE), (5, 1, A), (6, 1, B)]
    assert [r.role for r in plan] == ["baseline", "leader", "leader"] * 2
    assert ladder.schedule(LINEUP, 0) == []


def test_a_run_is_keyed_by_phase_config_and_repeat():
    assert ladder.run_key("ladder", A, 0) == ("ladder", A.key(), 0)
    # The same config in another order of keys is the same run.
    same = TrialConfig(speculative_config=dict(reversed(list(A.speculative_config.items()))))
    assert ladder.run_key("ladder", same, 0) == ladder.run_key("ladder", A, 0)
    assert len({ladder.run_key(p, c, r) for p in ("ladder", "verify") for c in (A, B)
                for r in (0, 1)}) == 8


def test_every_run_is_measured_in_order_and_stored_with_what_it_is(campaign, said):
    fake = FakeMeasure()
    runs = ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=fake)
    assert [label for label, _ in fake.calls] == [c.label() for _, c in LINEUP] * 2
    assert [(r.role, r.key, r.repeat) for r in runs] == [
        (role, c.key(), rep) for rep in (0, 1) for role, c in LINEUP]
    first = runs[1]
    assert first.phase == "ladder" and first.label == A.label()
    assert first.config == A
    assert isinstance(first.result, BenchResult)
    assert [lv.concurrency for lv in first.result.levels] == list(LADDER)
    assert first.failure is None and first.tokens is None
    # Each run has its own folder, named after its trial in the companion study.
    assert [d for _, d in fake.calls] == [campaign.out_dir / "policy" / f"run{n}"
                                          for n in range(6)]
    assert said[1] == f"  [ladder 2/6] {A.label()}: c=1 130.0 tok/s | c=4 520.0 tok/s"


def test_the_runs_live_in_a_companion_study_beside_the_study(campaign):
    ladder.measure(campaign, lineup=LINEUP[:1], phase="ladder", measure_run=FakeMeasure())
    storage = optuna_compat.storage_of(campaign.study)
    names = {s.study_name for s in storage.get_all_studies()}
    assert names == {"fake-study", "fake-study.policy"}
    assert campaign.study.trials == []  # the study itself is left alone
    comp = ladder.companion(campaign.study)
    assert [t.user_attrs["ladder"] for t in comp.trials] == [list(LADDER)] * 2
    assert [t.values for t in comp.trials] == [[100.0], [100.0]]  # c=1 output throughput


def test_a_failed_run_is_recorded_with_its_reason_and_the_campaign_goes_on(campaign, said):
    fake = FakeMeasure(fail=(A,))
    runs = ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=fake)
    assert len(fake.calls) == 6
    failed = [r for r in runs if r.failure]
    assert [(r.key, r.repeat) for r in failed] == [(A.key(), 0), (A.key(), 1)]
    assert failed[0].failure.kind == "engine_crashed" and failed[0].result is None
    assert "  [ladder 2/6] " + A.label() + ": FAIL (engine_crashed) vLLM exited with status 1" \
        in said


def test_a_resumed_campaign_measures_only_what_is_missing(campaign):
    with pytest.raises(KeyboardInterrupt):
        ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=FakeMeasure(die_at=3))
    comp = ladder.companion(campaign.study)
    assert [t.state.name for t in comp.trials] == ["COMPLETE", "COMPLETE", "RUNNING"]

    again = FakeMeasure()
    runs = ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=again)
    # The run the killed driver left RUNNING failed, and is measured again with the rest.
    assert [label for label, _ in again.calls] == [B.label(), BASE.label(), A.label(),
                                                   B.label()]
    assert [t.state.name for t in comp.trials][:3] == ["COMPLETE", "COMPLETE", "FAIL"]
    done = [(r.key, r.repeat) for r in runs if r.result]
    assert sorted(done) == sorted((c.key(), rep) for rep in (0, 1) for _, c in LINEUP)

    third = FakeMeasure()
    ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=third)
    assert third.calls == []  # everything is measured: nothing runs again


def test_failed_runs_are_measured_again_on_resume(campaign):
    ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=FakeMeasure(fail=(B,)))
    again = FakeMeasure()
    ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=again)
    assert [label for label, _ in again.calls] == [B.label(), B.label()]


def test_phases_are_kept_apart(campaign):
    ladder.measure(campaign, lineup=LINEUP, phase="ladder", measure_run=FakeMeasure())
    fake = FakeMeasure()
    verify = ladder.measure(campaign, lineup=[("policy", A)], phase="verify", measure_run=fake)
    assert len(fake.calls) == 2  # the same config, another phase: measured again
    assert [(r.phase, r.role) for r in verify] == [("verify", "policy")] * 2
    assert len(ladder.stored_runs(campaign.study)) == 8
    assert len(ladder.stored_runs(campaign.study, "ladder")) == 6


def test_a_study_without_a_campaign_has_no_runs():
    assert ladder.stored_runs(fake_study()) == []


def test_a_runs_token_capture_is_kept_in_its_folder(campaign):
    capture = TokenCapture(requests=tuple(
        RequestTokens(concurrency=1, index=i, warmup=False, prompt=np.arange(8),
                      output=np.arange(16), max_tokens=16) for i in range(2)))
    runs = ladder.measure(campaign, lineup=LINEUP[:1], phase="ladder",
                          measure_run=FakeMeasure(tokens=capture.to_bytes()))
    meta = runs[0].tokens
    assert meta.file == "policy/run0/tokens.npz" and meta.output_tokens == 32
    assert TokenCapture.load(campaign.out_dir / meta.file).digest == capture.digest


def test_a_stored_run_with_an_undefined_metric_reads_back_as_nan():
    import math

    from tuner.records.policy import LadderRun
    from tuner.search import outcomes

    level = LevelMetrics.model_validate(fake_level(1, output_throughput=100.0,
                                                   mean_tpot_ms=float("nan")))
    attr = outcomes.result_attr(BenchResult(config=A, engine=EngineInfo(start_s=1.0), levels=(level,)))
    assert attr["levels"][0]["mean_tpot_ms"] is None  # JSON has no NaN
    run = LadderRun.model_validate({"key": A.key(), "result": attr})
    assert math.isnan(run.result.levels[0].mean_tpot_ms)
    assert run.result.levels[0].output_throughput == 100.0
