"""The replay's predicted table in the outputs: predicted.csv written and read back, the
"Predicted by replay" report section, hollow predicted points on the Pareto plots, and the
terminal table of `tuner predict`."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

# tests/ holds the shared fakes; it is not a package, so put it on the path explicitly.
from study_fakes import ngram, realistic_study, suffix

from tuner.api import write_report
from tuner.outputs import figures, pareto_plot, plots
from tuner.outputs.console import predict_table
from tuner.outputs.predictions import (
    PREDICTION_COLUMNS,
    load_predictions,
    read_rows,
    write_predictions,
)
from tuner.records.configs import TrialConfig
from tuner.records.predictions import PredictedRow

PATH = "speculative path (anchored on the aligned baseline)"
# realistic_study's measured medians, per level: baseline, ngram k=5, suffix k=8.
BASE = {1: 22.8, 8: 111.0}
MEASURED = {"ngram5": {1: (47.7, 3.31), 8: (113.6, 3.31)},
            "suffix8": {1: (57.4, 3.9), 8: (159.7, 3.9)}}


def _tpot(c: int, thr: float) -> float:
    return 1000.0 * c / thr * 0.92  # as realistic_study derives its TPOT


def row(spec: dict[str, Any] | None, c: int, *, thr: float | None, acc: float | None,
        measured: tuple[float, float] | None = None, calibration: bool = False,
        spread: float | None = 2.0) -> PredictedRow:
    """A predicted row as tuner.replay.predict makes it; `measured` = (tok/s, acc. length),
    `spread` its own launches' half-range in percent (None: launched once; the level's
    pooled SD is 1.5%). No sampling error: none at temperature 0 (tuner.replay.sampling)."""
    cfg = TrialConfig(speculative_config=spec)
    k = (spec or {}).get("num_speculative_tokens", 0)
    r = PredictedRow(
        key=cfg.key(), label=cfg.label(), method=cfg.method,
        speculative_config=json.dumps(spec, sort_keys=True) if spec else "",
        concurrency=c, acceptance_rate=(acc - 1) / k if acc and k else None,
        acceptance_length=acc, drafted_per_step=float(k), tokens_per_step=acc or 1.0,
        uniform_share=0.5 if k else 1.0, alternate_stream_requests=0,
        pred_output_throughput=thr, pred_mean_tpot_ms=_tpot(c, thr) if thr else None,
        pred_mean_ttft_ms=50.0 if thr else None,
        pred_speedup=thr / BASE[c] if thr else None, path=PATH if thr else None,
        level_output_throughput_sd_pct=1.5, calibration=calibration,
        per_position="[0.7, 0.5]", steps_per_request=60.0)
    if measured is not None:
        m_thr, m_acc = measured
        r = dataclasses.replace(
            r, measured_trials=3, meas_output_throughput=m_thr,
            meas_mean_tpot_ms=_tpot(c, m_thr), meas_mean_ttft_ms=45.0,
            meas_acceptance_length=m_acc, meas_output_throughput_spread_pct=spread)
        if thr:
            r = dataclasses.replace(
                r, err_output_throughput_pct=100 * (thr - m_thr) / m_thr,
                err_mean_tpot_pct=100 * (_tpot(c, thr) - _tpot(c, m_thr)) / _tpot(c, m_thr))
        if acc and spec:
            r = dataclasses.replace(r, err_acceptance_length_pct=100 * (acc - m_acc) / m_acc)
    return r


def predicted_rows(*, priced: bool = True) -> list[PredictedRow]:
    """Baseline, the two measured configs (n-gram k=5 the calibration launch) and twelve
    n-gram configs never launched, at both levels of realistic_study. Unpriced: no step
    cost yet, so every pred_* is None (the baseline's own row keeps its measurement)."""
    rows = []
    for c in (1, 8):
        rows.append(row(None, c, thr=BASE[c], acc=None, measured=(BASE[c], math.nan)))
        rows.append(row(ngram(5), c, thr=50.0 if c == 1 else 120.0, acc=3.2,
                        measured=MEASURED["ngram5"][c], calibration=True))
        rows.append(row(suffix(8), c, thr=54.0 if c == 1 else 150.0, acc=4.1,
                        measured=MEASURED["suffix8"][c], spread=None))
        for i, (k, lo) in enumerate((k, lo) for k in range(2, 8) for lo in (1, 2)):
            rows.append(row(ngram(k, lo, 6), c, thr=30.3 + 2.5 * i if c == 1 else 100.0 + 3 * i,
                            acc=1.5 + 0.2 * i))
    if not priced:
        rows = [r if r.method == "none" else dataclasses.replace(
            r, pred_output_throughput=None, pred_mean_tpot_ms=None, pred_mean_ttft_ms=None,
            pred_speedup=None, path=None, err_output_throughput_pct=None,
            err_mean_tpot_pct=None) for r in rows]
    return rows


# --- predicted.csv ----------------------------------------------------------------------------
def test_predictions_round_trip_through_predicted_csv(tmp_path):
    rows = predicted_rows()
    # NaN and None both come back missing
    rows[3] = dataclasses.replace(rows[3], pred_output_throughput=math.nan)
    path = write_predictions(rows, tmp_path / "study")
    assert path == tmp_path / "study" / "predicted.csv"
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    header = path.read_text().splitlines()[0].split(",")
    assert tuple(header[:len(PREDICTION_COLUMNS)]) == PREDICTION_COLUMNS
    assert header[len(PREDICTION_COLUMNS):] == ["per_position", "steps_per_request", "path_cost",
                                                "pred_speculation_gain", "ngram_path"]

    df = load_predictions(tmp_path / "study")
    assert df is not None and len(df) == len(rows)
    assert df["concurrency"].dtype.kind == "i" and df["measured_trials"].dtype.kind == "i"
    assert df["calibration"].tolist() == [r.calibration for r in rows]
    for got, want in zip(df.to_dict("records"), rows, strict=True):
        for col in PREDICTION_COLUMNS:
            w, g = getattr(want, col), got[col]
            if w is None or (isinstance(w, float) and math.isnan(w)):
                assert g is None or (isinstance(g, float) and math.isnan(g)), (col, g)
            elif isinstance(w, float):
                assert g == pytest.approx(w), col
            else:
                assert g == w, col
    assert df.loc[0, "speculative_config"] == ""  # the baseline's, not NaN
    assert json.loads(df.loc[1, "speculative_config"]) == ngram(5)
    # read back as records: the same rows, a missing cell (NaN or None) as None
    back = read_rows(df)
    assert back[3].pred_output_throughput is None
    for got_row, want in zip(back, rows, strict=True):
        for f in dataclasses.fields(PredictedRow):
            w, g = getattr(want, f.name), getattr(got_row, f.name)
            if w is None or (isinstance(w, float) and math.isnan(w)):
                assert g is None, f.name
            elif isinstance(w, float):
                assert g == pytest.approx(w), f.name
            else:
                assert g == w and type(g) is type(w), f.name


def test_an_empty_prediction_still_writes_the_header(tmp_path):
    write_predictions([], tmp_path)
    df = load_predictions(tmp_path)
    assert df is not None and df.empty and tuple(df.columns) == PREDICTION_COLUMNS


@pytest.mark.parametrize("content", [None, "", "\x00\xff garbage", "a,b\n1,2\n"])
def test_load_predictions_is_none_when_absent_or_unreadable(tmp_path, content):
    if content is not None:
        (tmp_path / "predicted.csv").write_text(content)
    assert load_predictions(tmp_path) is None


def test_a_column_left_out_by_another_writer_reads_as_missing(tmp_path):
    pd.DataFrame([r.csv_row() for r in predicted_rows()]).drop(
        columns=["path", "calibration"]).to_csv(tmp_path / "predicted.csv", index=False)
    df = load_predictions(tmp_path)
    assert df is not None and df["path"].isna().all() and not df["calibration"].any()
    assert all(r.path is None and not r.calibration for r in read_rows(df))


# --- the report and the Pareto plots ----------------------------------------------------------
@pytest.fixture
def drawn(monkeypatch) -> dict[str, dict[str, Any]]:
    """What each saved figure showed: legend labels and how many hollow markers it drew."""
    seen: dict[str, dict[str, Any]] = {}
    save = figures.save

    def spy(fig, path: Path) -> Path:
        labels, hollow = [], 0
        for ax in fig.axes:
            legend = ax.get_legend()
            labels += [t.get_text() for t in legend.get_texts()] if legend else []
            for coll in ax.collections:
                if len(coll.get_offsets()) and len(coll.get_facecolors()) == 0:
                    hollow += len(coll.get_offsets())
        seen[path.name] = {"labels": labels, "hollow": hollow,
                           "title": fig.axes[0].get_title() if fig.axes else ""}
        return save(fig, path)

    monkeypatch.setattr(figures, "save", spy)
    return seen


def test_the_report_shows_predictions_beside_measurements(tmp_path, drawn):
    out = tmp_path / "study"
    write_predictions(predicted_rows(), out)
    paths = write_report(realistic_study(), out)
    assert paths["predicted_csv"] == out / "predicted.csv"

    md = paths["report_md"].read_text()
    section = md[md.index("## Predicted by replay"):md.index("## Trials")]
    assert "14 configs predicted from the baseline's own tokens at concurrency 1, 8; " \
           "2 of them measured" in section
    assert PATH in section
    top1 = section[section.index("### Concurrency 1: top 5 predicted"):
                   section.index("### Concurrency 8")]
    # best predicted first: ngram k=7 window 2-6 (57.8 tok/s), then k=7 1-6, then suffix k=8
    body = [line for line in top1.splitlines() if line.startswith("| ") and "tok/s" not in line]
    assert len(body) == 5
    assert body[0].startswith("| ngram k=7 window 2-6 | 3.70 | 57.8 |")
    assert body[2].startswith("| suffix k=8 ") and "| 2.37x |" in body[2]
    versus = section[section.index("### Predicted vs measured"):]
    # Each error beside the measured spread between launches: the config's own, or the
    # level's pooled SD where it ran once.
    assert "| ngram k=5 window 2-5 (calibration, in-sample) | 1 | 50.0 / 47.7 (+4.8%) | " \
        "\u00b12.0% | 18.4 / 19.3 (-4.6%) | 3.20 / 3.31 (-3.3%) |" in versus
    assert "| 8 | 150.0 / 159.7 (-6.1%) | sd 1.5% | 49.1 / 46.1 (+6.5%) | 4.10 / 3.90 (+5.1%) |" \
        in versus
    assert "Spread: how far the measured throughput moves between launches" in section
    assert "baseline" not in versus  # speculative configs only

    page = paths["report_html"].read_text()
    assert "<h2>Predicted by replay</h2>" in page and "<h3>Predicted vs measured</h3>" in page
    assert page.index("<h2>Pareto fronts</h2>") < page.index("<h2>Predicted by replay</h2>") \
        < page.index("<h2>Trials</h2>")
    assert "<td>50.0 / 47.7 (+4.8%)</td>" in page
    assert "<td class='cfg'>ngram k=5 window 2-5 (calibration, in-sample)</td>" in page

    # 14 hollow points per level beside the baseline's hollow square (the baseline's
    # predicted row is its measurement: not drawn twice)
    for c in (1, 8):
        fig = drawn[f"pareto_c{c}.png"]
        assert "predicted (replay)" in fig["labels"]
        assert "measured \u2192 its prediction" in fig["labels"]
        assert fig["hollow"] == 14 + 1 and "8 configs measured, 14 predicted" in fig["title"]
    # the other plots are not about predictions
    assert "predicted (replay)" not in drawn["speedup_vs_concurrency.png"]["labels"]


def test_without_predicted_csv_nothing_about_predictions_appears(tmp_path, drawn):
    paths = write_report(realistic_study(), tmp_path)
    assert "predicted_csv" not in paths
    assert "Predicted by replay" not in paths["report_md"].read_text()
    assert "Predicted by replay" not in paths["report_html"].read_text()
    assert "predicted (replay)" not in drawn["pareto_c1.png"]["labels"]
    assert "predicted" not in drawn["pareto_c1.png"]["title"]


def test_the_plots_draw_the_points_the_analysis_computed(tmp_path, drawn):
    from tuner.analysis.frame import trials_frame
    from tuner.analysis.pareto import points, speedups

    drawn_points = points(speedups(trials_frame(realistic_study())))
    assert [p.name for p in pareto_plot.pareto_plots(drawn_points, tmp_path)] == [
        "pareto_c1.png", "pareto_c8.png"]
    drawn_all, _ = plots.draw_all(drawn_points, tmp_path)
    assert drawn_all["pareto"] and drawn["pareto_c8.png"]["hollow"] == 1  # the baseline square


def test_a_report_before_calibration_shows_acceptance_only(tmp_path, drawn):
    out = tmp_path / "study"
    write_predictions(predicted_rows(priced=False), out)
    paths = write_report(realistic_study(), out)
    md = paths["report_md"].read_text()
    section = md[md.index("## Predicted by replay"):md.index("## Trials")]
    assert "No speculative launch calibrates the step cost yet" in section
    # ranked by acceptance length instead: suffix k=8 (4.10) leads
    first = [line for line in section.splitlines() if line.startswith("| suffix")][0]
    assert first.startswith("| suffix k=8 ") and first.endswith("| 4.10 | - | - | - |")
    # measured beside an unknown prediction; acceptance has both, and its error
    assert "| 1 | - / 47.7 | \u00b12.0% | - / 19.3 | 3.20 / 3.31 (-3.3%) |" in section
    assert "predicted (replay)" not in drawn["pareto_c1.png"]["labels"]


# --- the terminal table -------------------------------------------------------------------------
def _block(text: str, c: int) -> list[str]:
    start = text.index(f"Concurrency {c}:")
    return text[start:].split("\n\n")[0].splitlines()


def test_predict_table_ranks_by_predicted_throughput_and_shows_errors():
    text = predict_table(predicted_rows(), top=4)
    lines = _block(text, 1)
    assert lines[0] == "Concurrency 1: 14 configs predicted; top 4 by predicted throughput"
    assert lines[1].split()[:3] == ["config", "acc", "len"]
    body = lines[3:]
    assert body[0].startswith("baseline (no speculation)") and len(body) == 5
    # 57.8, 55.3, 54.0 and 52.8 tok/s predicted
    assert [line.split()[:3] for line in body[1:]] == [
        ["ngram", "k=7", "window"], ["ngram", "k=7", "window"], ["suffix", "k=8",
                                                                 "max_spec_factor=1.0"],
        ["ngram", "k=6", "window"]]
    assert [line.split()[3] for line in (body[1], body[2], body[4])] == ["2-6", "1-6", "2-6"]
    assert body[1].split()[4:6] == ["3.70", "57.8"]
    assert body[3].split()[-9:] == ["4.10", "54.0", "17.0", "50", "2.37x", "57.4", "-5.9%",
                                    "sd", "1.5%"]
    assert body[0].split()[-3:] == ["22.8", "+0.0%", "\u00b12.0%"]
    assert not any(line.startswith("ngram k=5 ") for line in body)  # 6th best, cut by top=4

    c8 = "\n".join(_block(text, 8))
    assert "ngram k=5 window 2-5 *" not in c8  # 120 tok/s is not in the top 4 at c=8
    assert "suffix k=8" in c8 and "+0.0%" in c8
    assert text.count("Concurrency") == 2


def test_predict_table_marks_the_calibration_launch_as_in_sample():
    text = predict_table(predicted_rows(), top=20, levels=[1])
    assert "Concurrency 8" not in text
    cal = next(line for line in text.splitlines() if line.startswith("ngram k=5 window 2-5 *"))
    assert cal.split()[-3:] == ["47.7", "+4.8%", "\u00b12.0%"]
    unmeasured = next(line for line in text.splitlines()
                      if line.startswith("ngram k=2 window 1-6"))
    # never launched: its predictions, and no measured figure or error after them
    assert unmeasured.split()[-5:] == ["1.50", "30.3", "30.4", "50", "1.33x"]
    assert ("* calibration launch: the step cost was fitted on it, so its error is "
            "in-sample.\n\nSpread: how far") in text


def test_predict_table_without_a_step_cost_ranks_by_acceptance():
    text = predict_table(predicted_rows(priced=False), top=3, levels=[1, 2])
    lines = _block(text, 1)
    assert "top 3 by acceptance length (no speculative launch calibrates" in lines[0]
    assert lines[4].startswith("suffix k=8") and lines[4].split()[-9:] == [
        "4.10", "-", "-", "-", "-", "57.4", "-", "sd", "1.5%"]
    assert "Concurrency 2: nothing predicted at this level." in text
    assert predict_table([]).startswith("Nothing predicted")
