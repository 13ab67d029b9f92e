"""The policy follows the engine: what a K table does to vLLM's engine path
(tuner.speculative.schedule_rules.schedule_path), that the installed vLLM's source still says
so, and that the policy withholds a schedule where the path changes (before any launch) or
where its verify launch ran another path, ignored the table or measured slower than static K,
offering the static K of the band that pays; the stored H100 study
(benchmarks/data/h100/draft8b-synthetic-c1-128) is the case that showed it."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from study_fakes import fake_level

from tuner.analysis import ladder_stats as LS
from tuner.analysis import policy as P
from tuner.analysis import schedule_verification as V
from tuner.outputs import policy_words
from tuner.records.configs import TrialConfig
from tuner.records.policy import LadderRun, PathChange, PathRule, ScheduleBasis
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.speculative.schedule_rules import FULL_GRAPH_MODES, schedule_path, varying_k

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "benchmarks/data/h100/draft8b-synthetic-c1-128"
FIELDS = ("model_runner", "async_scheduling", "cudagraph_mode", "attention_backend")


# --- the rule -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", FULL_GRAPH_MODES)
def test_a_table_on_the_v1_runner_turns_full_graphs_piecewise(mode):
    rule = schedule_path("draft_model", runner="V1", cudagraph_mode=mode)
    assert rule.changes == (PathChange(field="cudagraph_mode", static=mode,
                                       schedule="PIECEWISE"),)
    assert "_maybe_override_dynamic_sd_cudagraph_mode" in rule.vllm_source
    assert rule.ignored_issue is None


@pytest.mark.parametrize("runner, mode", [("V1", "PIECEWISE"), ("V1", "NONE"), ("V1", None),
                                          (None, "FULL_AND_PIECEWISE"),
                                          ("V2", "FULL_AND_PIECEWISE")])
def test_no_change_where_graphs_are_not_full_the_runner_is_v2_or_not_known(runner, mode):
    assert schedule_path("ngram", runner=runner, cudagraph_mode=mode).changes == ()


@pytest.mark.parametrize("method, issue", [("eagle", 51510), ("eagle3", 51510),
                                           ("deepseek_mtp", 51510), ("ngram", None),
                                           ("dflash", None)])
def test_on_v2_an_autoregressive_drafter_names_the_issue_where_the_table_is_ignored(method,
                                                                                    issue):
    rule = schedule_path(method, runner="V2", cudagraph_mode="FULL_AND_PIECEWISE")
    assert rule.changes == () and rule.ignored_issue == issue


def _vllm_file(rel: str) -> str:
    spec = importlib.util.find_spec("vllm")  # locates vLLM, runs none of it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed in this Python")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        pytest.skip(f"this vLLM has no {rel}")
    return path.read_text()


def test_the_installed_vllm_source_still_overrides_full_graphs_for_a_table():
    text = _vllm_file("config/vllm.py")
    block = text[text.index("def _maybe_override_dynamic_sd_cudagraph_mode"):]
    block = block[:block.index("\n    def ")]
    for line in ("not speculative_config.uses_dynamic_speculative_decoding()",
                 "not self.compilation_config.cudagraph_mode.has_full_cudagraphs()",
                 "or self.use_v2_model_runner",
                 "Overriding cudagraph_mode from %s to ",
                 "self.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE"):
        assert line in block, \
            "config/vllm.py changed: read tuner/speculative/schedule_rules.py's rule again"
    assert "self._maybe_override_dynamic_sd_cudagraph_mode()" in text


def test_the_full_graph_modes_are_those_whose_largest_mode_is_full():
    text = _vllm_file("config/compilation.py")
    for line in ("FULL_DECODE_ONLY = (FULL, NONE)", "FULL_AND_PIECEWISE = (FULL, PIECEWISE)",
                 "return self.max_cudagraph_mode() == CUDAGraphMode.FULL"):
        assert line in text
    assert set(FULL_GRAPH_MODES) == {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}


# --- the policy, on synthetic ladders ------------------------------------------------------------
SPEC = {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 3}
V1_FULL = {"model_runner": "V1", "async_scheduling": "false",
           "cudagraph_mode": "FULL_AND_PIECEWISE", "attention_backend": "FLASH_ATTN"}
V1_PIECEWISE = {**V1_FULL, "cudagraph_mode": "PIECEWISE"}
V2_FULL = {**V1_FULL, "model_runner": "V2", "async_scheduling": "true"}


def _runs(config: TrialConfig, levels: dict[int, tuple[float, float]], *, details: dict,
          repeats: int = 2, phase: str = "ladder") -> list[LadderRun]:
    """`repeats` runs of `config`: per level (output throughput, drafts), the engine path
    `details`."""
    return [LadderRun(key=config.key(), phase=phase, config=config, result=BenchResult(
        config=config, engine=EngineInfo(start_s=1.0, details=details), levels=tuple(
            LevelMetrics.model_validate({**fake_level(c, output_throughput=tp * (1 + i / 1000),
                                                      mean_tpot_ms=1000.0 / tp),
                                         "spec_decode_num_drafts": drafts})
            for c, (tp, drafts) in levels.items())))
        for i in range(repeats)]


K3 = TrialConfig(speculative_config=SPEC)
LINEUP = [("baseline", TrialConfig()), ("leader", K3)]
LADDER = (_runs(TrialConfig(), {1: (100, 0), 8: (800, 0), 64: (6000, 0)}, details=V2_FULL)
          + _runs(K3, {1: (150, 600), 8: (1100, 1300), 64: (5000, 10000)}, details=V1_FULL))


def _drafted(rule: PathRule | None = None):
    return P.draft_policy(LADDER, LINEUP, max_batch=256, where="x",
                          varying_k=varying_k("draft_model"), path_rule=rule)


def test_a_path_the_table_changes_withholds_the_schedule_before_any_launch():
    rule = schedule_path("draft_model", runner="V1", cudagraph_mode="FULL_AND_PIECEWISE")
    doc = policy_words.worded(_drafted(rule))
    # No schedule and no config: tuner.api spends no verify launch on it.
    assert doc.schedule is None and doc.speculative_config is None
    check = doc.schedule_check
    assert check.basis == (ScheduleBasis.PATH_PREDICTED,)
    assert check.changes == rule.changes and check.vllm_source == rule.vllm_source
    assert check.schedule == doc.bands and check.schedule[0][2] == 3 and check.schedule[-1][2] == 0
    assert check.offered_k == 3 and check.offered_bands == doc.bands
    assert doc.needs_router and doc.fallback_bands[-1].endswith("speculation off")
    assert doc.path_rule == rule
    assert "No launch was spent" in doc.headline and "static K=3" in doc.headline
    assert "PIECEWISE" in doc.headline


def test_without_a_path_change_the_schedule_is_emitted_for_its_verify_launch():
    doc = _drafted(schedule_path("draft_model", runner="V1", cudagraph_mode="PIECEWISE"))
    assert doc.schedule_check is None
    assert doc.speculative_config["num_speculative_tokens_per_batch_size"] == [
        list(b) for b in doc.schedule]
    assert "schedule_check" not in doc.model_dump()  # the file keeps its keys


def _verified(levels: dict[int, tuple[float, float]], details: dict,
              rule: PathRule | None = None):
    doc = _drafted(rule)
    policy_cfg, static = P.policy_configs(doc, LINEUP)
    verify = _runs(policy_cfg, levels, details=details, repeats=1, phase="verify")
    return policy_words.worded(V.with_verification(
        doc.model_copy(update={"serve_command": "vllm serve m"}), LADDER + verify,
        policy_cfg=policy_cfg, static=static, side_by_side=False, path_fields=FIELDS))


def test_a_schedule_that_ran_the_static_path_and_held_is_emitted():
    doc = _verified({1: (150, 600), 8: (1100, 1300), 64: (6000, 900)}, V1_FULL)
    assert doc.schedule_check is None and doc.speculative_config is not None
    assert doc.serve_command == "vllm serve m"
    ver = doc.verification
    assert ver.path_changes == () and ver.slower_at == () and ver.honoured
    assert "path_changes" not in ver.model_dump()


def test_another_path_and_a_slower_schedule_withhold_it_after_the_verify_launch():
    # The stored H100 case in small: piecewise graphs, the baseline's speed at c=1 and 8,
    # below the baseline in the K=0 band.
    doc = _verified({1: (100, 600), 8: (790, 1300), 64: (4100, 1600)}, V1_PIECEWISE)
    check = doc.schedule_check
    assert check.basis == (ScheduleBasis.PATH_MEASURED, ScheduleBasis.SLOWER)
    assert check.changes == (PathChange(field="cudagraph_mode", static="FULL_AND_PIECEWISE",
                                        schedule="PIECEWISE"),)
    assert check.levels == (1, 8, 64) and check.offered_k == 3
    assert doc.schedule is None and doc.speculative_config is None and doc.serve_command is None
    assert doc.verification.slower_at == (1, 8, 64)
    assert doc.needs_router and doc.fallback_bands
    assert doc.headline.startswith("No per-batch-size schedule for")
    assert "static K=3" in doc.headline and "No launch was spent" not in doc.headline


def test_an_ignored_table_is_withheld_naming_the_issue_of_that_path():
    rule = schedule_path("draft_model", runner="V2", cudagraph_mode="FULL_AND_PIECEWISE")
    assert rule.ignored_issue == 51510
    # Drafts where the table says K=0 as many as static K's: ignored.
    off = _verified({1: (150, 600), 8: (1100, 1300), 64: (6000, 9000)}, V1_FULL, rule)
    assert off.schedule_check.basis[0] is ScheduleBasis.DRAFTS_WHERE_OFF
    assert off.schedule_check.vllm_issue == 51510 and 64 in off.schedule_check.levels
    assert "vLLM issue 51510" in off.headline and not off.verification.honoured
    # Almost no drafts where it says K=3.
    on = _verified({1: (150, 10), 8: (1100, 1300), 64: (6000, 900)}, V1_FULL, rule)
    assert on.schedule_check.basis == (ScheduleBasis.NO_DRAFTS_WHERE_ON,)
    assert on.schedule_check.levels == (1,) and on.verification.no_drafts_where_on == (1,)


# --- the stored H100 study ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The study's ladder and verify runs and the ladder's lineup (a copy: opening writes)."""
    from tuner.search import ladder
    from tuner.search import study as st

    where = tmp_path_factory.mktemp("draft8b")
    shutil.copy(STUDY / "study.journal", where / "study.journal")
    runs = ladder.stored_runs(st.open_existing(where))
    lineup, seen = [], set()
    for run in runs:
        if run.phase == "ladder" and run.key not in seen:
            seen.add(run.key)
            lineup.append((run.role, run.config))
    return ([r for r in runs if r.phase == "ladder"], [r for r in runs if r.phase == "verify"],
            lineup)


def test_the_stored_study_would_have_withheld_its_schedule_before_launching_it(stored):
    ladder_runs, _, lineup = stored
    leader = next(c for role, c in lineup if role == "leader")
    path = LS.engine_details(ladder_runs, leader.key())
    assert (path["model_runner"], path["cudagraph_mode"]) == ("V1", "FULL_AND_PIECEWISE")
    doc = P.draft_policy(ladder_runs, lineup, max_batch=1024, where="x",
                         varying_k=varying_k(leader.method),
                         path_rule=schedule_path(leader.method, runner=path["model_runner"],
                                                 cudagraph_mode=path["cudagraph_mode"]))
    check = doc.schedule_check
    assert check.basis == (ScheduleBasis.PATH_PREDICTED,)
    assert check.schedule == ((1, 63, 3), (64, 1024, 0)) and check.offered_k == 3
    assert doc.speculative_config is None


def test_the_stored_verify_launch_ran_piecewise_and_slower_so_it_is_withheld(stored):
    ladder_runs, verify_runs, lineup = stored
    doc = P.draft_policy(ladder_runs, lineup, max_batch=1024, where="x",
                         varying_k=varying_k("draft_model"))
    policy_cfg, static = P.policy_configs(doc, lineup)
    assert verify_runs[0].key == policy_cfg.key()
    doc = policy_words.worded(V.with_verification(
        doc, ladder_runs + verify_runs, policy_cfg=policy_cfg, static=static,
        side_by_side=False, path_fields=FIELDS))
    check = doc.schedule_check
    assert check.basis == (ScheduleBasis.PATH_MEASURED, ScheduleBasis.SLOWER)
    assert check.changes == (PathChange(field="cudagraph_mode", static="FULL_AND_PIECEWISE",
                                        schedule="PIECEWISE"),)
    # It drafted as static K=3 did where K=3 (the table was applied), so not "ignored".
    assert doc.verification.honoured and doc.verification.no_drafts_where_on == ()
    assert doc.verification.slower_at == (1, 8, 32, 64, 128)
    assert check.offered_k == 3 and doc.speculative_config is None


def test_the_stored_h100_logs_show_the_schedule_ran_piecewise_where_static_k_ran_full():
    # benchmarks/data/h100/draft8b-pathcause-c1-128: the engine logs of static K=3 and of
    # the schedule, on one lease; vLLM logged its override only for the schedule.
    from tuner.measure import enginepath

    where = ROOT / "benchmarks/data/h100/draft8b-pathcause-c1-128"
    static, sched = ((where / name / "engine.log").read_text() for name in ("k3", "sched"))
    assert "Overriding cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE" in sched
    assert "Overriding cudagraph_mode" not in static
    paths = [enginepath.read_log(text).details() for text in (static, sched)]
    assert V.path_changes(*paths, enginepath.FIELDS) == (
        PathChange(field="cudagraph_mode", static="FULL_AND_PIECEWISE", schedule="PIECEWISE"),)
    rule = schedule_path("draft_model", runner=paths[0]["model_runner"],
                         cudagraph_mode=paths[0]["cudagraph_mode"])
    assert rule.changes[0].schedule == paths[1]["cudagraph_mode"]
