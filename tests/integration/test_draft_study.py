"""A study of the draft space with a drafter of the user's own (--draft-model), on the fake
engine simulating a drafter: the study keeps the drafter it launched; resuming it with another
drafter is one message and exit 2, nothing measured changed; `tuner predict STUDY --space
draft` and `tuner report` read the study's drafter where the space names the embedded
default's (`model: embedded-draft`); `tuner bench --draft-model` launches that drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import fake_engine_spec

from tuner import api, checks, cli
from tuner.api import engines
from tuner.measure import model as embedded
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.search import study as st

RATES = tuple(round(0.8 ** (i + 1), 4) for i in range(6))
ENGINE = dict(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=2, drafter_rates=RATES,
              load_per_seq=0.1, drafter_ms_per_token=0.3)


def _drafter(root: Path, name: str) -> str:
    """A drafter folder the checks take: config.json and the target's tokenizer (the fake
    engine loads no weights)."""
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama",
                                                    "vocab_size": 49152}))
    for f in embedded.embedded_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    return str(folder.resolve())


def _measured(out: Path) -> tuple:
    """The study as stored: its settings and every trial's state, values and records."""
    s = st.open_existing(out)
    return s.user_attrs, [(t.number, t.state, t.values, t.user_attrs) for t in s.trials]


def _options(out: Path, draft: str) -> OptimizeOptions:
    return OptimizeOptions(
        strategy="optuna", workload=WorkloadSpec(name="instructcoder", num_prompts=6,
                                                 output_len=24),
        space_name="draft", draft_model=draft, settings=MeasureSettings(concurrencies=(1, 2)),
        out_dir=out, study_name="s", n_trials=2, objectives=["output_throughput"],
        target_concurrency=1, constraints={})


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The study folder after a search with drafter A (baseline and K=3), and the drafters A
    and B."""
    root = tmp_path_factory.mktemp("draft-study")
    a, b = _drafter(root, "drafter-a"), _drafter(root, "drafter-b")
    out = root / "study"
    api.optimize_and_report(_options(out, a), engine=fake_engine_spec(**ENGINE),
                            say=lambda _line: None)
    return out, a, b


def test_the_study_keeps_the_drafter_it_launched(study) -> None:
    out, a, _ = study
    s = st.open_existing(out)
    assert st.settings_of(s).drafters == {"draft_model": a}
    launched = {t.user_attrs["label"] for t in s.trials}
    assert len(launched) == 2  # the baseline and the start point


def test_resuming_with_another_drafter_is_one_message_and_exit_2(study, monkeypatch,
                                                                capsys) -> None:
    out, a, b = study
    before = _measured(out)
    monkeypatch.setattr(engines, "resolve_engine", lambda _engine: fake_engine_spec(**ENGINE))
    rc = cli.main(["optimize", "--space", "draft", "--draft-model", b, "--output-dir",
                   str(out), "--study-name", "s", "--workload", "instructcoder",
                   "--num-prompts", "6", "--output-len", "24", "--concurrency", "1,2",
                   "--objectives", "output_throughput", "--strategy", "optuna",
                   "--n-trials", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines() == [err.strip()], err  # one message, no traceback
    assert f"started with the drafter {a}" in err and f"asks for {b}" in err
    assert "--output-dir" in err
    assert _measured(out) == before  # nothing measured changed


def test_predict_and_report_read_the_studys_drafter(study, monkeypatch, capsys) -> None:
    out, a, _ = study
    # Nothing is built or launched to read a study: the made drafter is never asked for.
    monkeypatch.setattr(embedded, "embedded_draft_dir", lambda: pytest.fail("built"))
    assert cli.main(["predict", str(out), "--space", "draft", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [ax["source_k"] for ax in doc["drafters"]] == [3]
    drafted = sorted({(r["concurrency"], r["drafted_per_step"]) for r in doc["rows"]
                      if r["method"] == "draft_model"})
    assert (1, 1) in drafted and (2, 3) in drafted
    # The space's K above the launched one are named with the study's drafter, not as
    # configs of an unresolved `embedded-draft` that was never launched.
    assert checks.EMBEDDED_DRAFT not in json.dumps(doc)
    assert sum("above K=3, the largest K launched" in s for s in doc["skipped"]) == 3
    assert all(a in r["speculative_config"] for r in doc["rows"] if r["method"] == "draft_model")
    assert cli.main(["report", str(out)]) == 0
    assert (out / "report.html").is_file()


def test_bench_launches_the_drafter_of_draft_model(study, tmp_path) -> None:
    from tuner.records.configs import TrialConfig
    from tuner.records.options import BenchOptions

    _, a, _ = study
    result = api.bench(BenchOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=4, output_len=16),
        settings=MeasureSettings(concurrencies=(1,)), draft_model=a, out_dir=tmp_path / "b",
        config=TrialConfig(speculative_config={"method": "draft_model",
                                               "num_speculative_tokens": 2})),
        engine=fake_engine_spec(**ENGINE), say=lambda _line: None)
    assert result.config.speculative_config["model"] == a
    stored = json.loads((tmp_path / "b" / "result.json").read_text())
    assert stored["config"]["speculative_config"]["model"] == a
    assert result.levels[0].spec_decode_acceptance_length > 1
