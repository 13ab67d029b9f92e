"""`tuner predict` as tuner.api runs it: every config of a space predicted from a study's
baseline tokens (the study's drafter read from its settings), or from a user's own request
logs priced on a study's step cost; no engine."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import engine_cmdline
from tuner.api import drafters
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.options import TrafficOptions
from tuner.records.outcomes import TrafficOutcome
from tuner.records.trials import Role

Say = Callable[[str], None]


def predict(*, study_dir: Path, storage_url: str | None = None, study_name: str | None = None,
            space_name: str | None = None, levels: tuple[int, ...] | None = None,
            say: Say = print) -> Any:
    """The predicted table of a space (default: the study's) from a study whose baseline holds
    token ids, calibrated on the study's measured trials; no engine, nothing written.
    Returns a tuner.replay.predict.Prediction."""
    from tuner.replay.predict import Prediction
    from tuner.replay.predict import predict as predict_space
    from tuner.search import candidates, trials
    from tuner.search import space as spaces
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    stored = st.settings_of(study)
    engine = stored.engine_spec
    measured = trials.measured_trials(study, study_dir)
    sp = drafters.study_space(spaces.load(space_name or stored.space), stored, measured)
    base = next((t for t in measured if t.role == Role.BASELINE and t.capture is not None),
                None)
    if base is None:
        raise ConfigError(f"{study_dir}: no completed baseline with token ids. Studies measured "
                          "before token capture (or on a vLLM that does not return token ids) "
                          "cannot be replayed; run `tuner optimize` again with a new "
                          "--study-name to measure one.")
    captured = base.capture.levels()
    if levels and set(levels) - set(captured):
        raise ConfigError(f"--levels {','.join(map(str, levels))}: the baseline's tokens were "
                          f"captured at {','.join(map(str, captured))}. Pick among those.")
    configs = candidates.candidates(sp)
    say(f"Replaying {len(configs)} configs of space '{sp.name}' over trial {base.number}'s "
        f"tokens ...")
    memo: dict = {}
    limits = engine_cmdline.engine_limits(engine)
    temperature = stored.workload.temperature

    def run(cands: list[TrialConfig]) -> Prediction:
        return predict_space(base.capture, cands, measured, max_model_len=limits.max_model_len,
                             max_num_seqs=limits.max_num_seqs, memo=memo,
                             levels=list(levels or captured), temperature=temperature)

    t0 = time.monotonic()
    configs, pred, added = candidates.refine(sp, configs, run(configs), run,
                                          limit=candidates.refine_limit(base.capture))
    if added:
        say(f"Searched the sampled grids around the predicted leaders: {added} more configs "
            f"replayed ({len(configs)} in all).")
    return dataclasses.replace(pred, seconds=time.monotonic() - t0)


def predict_traffic(options: TrafficOptions, *, say: Say = print) -> TrafficOutcome:
    """A space's acceptance over a user's own request logs (tuner.replay.traffic) at each
    level, a closed loop of c; with a study on the target hardware, also throughput, TPOT and
    speedup on its step cost. Writes traffic.csv and traffic.json; no engine."""
    from tuner.outputs import traffic as traffic_out
    from tuner.replay import traffic
    from tuner.replay.traffic import prompts
    from tuner.search import candidates
    from tuner.search import space as spaces

    levels = list(options.levels or (1,))
    sp = spaces.load(options.space_name or "ngram")
    cal, engine = _traffic_study(options, levels) if options.study_dir else (None, None)
    limits = engine_cmdline.engine_limits(engine) if engine else None
    say(f"Reading {options.traffic_path} ...")
    logs = traffic.read(options.traffic_path, tokenizer_for=_traffic_tokenizer,
                        model=options.model or _study_model(engine),
                        max_model_len=limits.max_model_len if limits else None,
                        context_of=prompts.context_len)
    configs = candidates.candidates(sp)
    say(f"Replaying {len(configs)} configs of space '{sp.name}' over {len(logs)} requests at "
        f"c={','.join(map(str, levels))} ...")
    pred = traffic.predict(logs, configs, levels=levels, max_model_len=logs.max_model_len,
                           max_num_seqs=limits.max_num_seqs if limits else
                           engine_cmdline.VLLM_DEFAULT_LIMITS["cuda"][0], calibration=cal)
    header = {"traffic": str(options.traffic_path), "requests": len(logs), "model": logs.model,
              "space": sp.name, "levels": levels, "study": pred.study,
              "max_model_len": logs.max_model_len, "skipped_records": dict(logs.skipped),
              "notes": pred.notes(), "seconds": round(pred.seconds, 3)}
    paths = traffic_out.write(pred.rows, header, options.out_dir or Path("outputs") /
                              f"traffic-{_traffic_stem(options.traffic_path)}")
    return TrafficOutcome(table=traffic_out.table(pred.rows, top=options.top, levels=levels),
                          notes=tuple(pred.notes()), rows=tuple(pred.rows), paths=paths,
                          requests=len(logs), configs=pred.configs, seconds=pred.seconds)


def _traffic_study(options: TrafficOptions, levels: list[int]) -> tuple[Any, EngineSpec]:
    """The study that prices a traffic: its step cost, fitted as `tuner predict` fits it on
    its measured trials (tuner.replay.predict with no config to predict), and its engine."""
    from tuner.replay.predict import predict as predict_space
    from tuner.replay.traffic import price
    from tuner.search import study as st
    from tuner.search import trials

    study = st.open_existing(options.study_dir, options.storage_url, options.study_name)
    engine = st.settings_of(study).engine_spec
    measured = trials.measured_trials(study, options.study_dir)
    base = next((t for t in measured if t.role == Role.BASELINE and t.capture is not None), None)
    if base is None:
        raise ConfigError(f"--study {options.study_dir}: no completed baseline with token ids, "
                          f"so no step cost to price the traffic on. Drop --study for "
                          f"acceptance only, or pass a study measured with token capture.")
    limits = engine_cmdline.engine_limits(engine)
    fitted = predict_space(base.capture, [], measured, max_model_len=limits.max_model_len,
                           max_num_seqs=limits.max_num_seqs,
                           levels=[c for c in levels if c in base.capture.levels()])
    return price.Calibration(costs=fitted.costs, base=base.capture, measured=measured,
                             max_num_seqs=limits.max_num_seqs,
                             study=str(options.study_dir)), engine


def _study_model(engine: EngineSpec | None) -> str | None:
    """The model (or tokenizer) a study's engine ran: None for none or the embedded default."""
    if engine is None or engine_cmdline.embedded_default(engine):
        return None
    return engine.tokenizer or engine.model


def _traffic_tokenizer(name: str | None) -> Any:
    """The tokenizer of `name` (a model, its folder or its tokenizer's), the embedded default's
    for None or its hub id."""
    from tuner.measure import model as embedded
    from tuner.measure import workloads

    if name is None or name in (engine_cmdline.EMBEDDED_HUB_ID, embedded.EMBEDDED_NAME):
        return workloads.load_tokenizer(workloads.EMBEDDED_TOKENIZER)
    try:
        return workloads.load_tokenizer(name)
    except ConfigError as e:
        cause = str(e).split(" Pass --tokenizer")[0]
        raise ConfigError(f"{cause} Pass --model with the model's folder or its tokenizer's "
                          f"(tokenizer.json, tokenizer_config.json), or a hub id this machine "
                          f"has cached.") from None


def _traffic_stem(path: Path) -> str:
    """requests.jsonl.xz -> requests: the name of a traffic file without its suffixes."""
    name = Path(path).name
    for suffix in (".gz", ".xz", ".jsonl", ".ndjson", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name or "file"
