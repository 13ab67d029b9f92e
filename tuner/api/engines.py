"""The engine every command measures on, and what it sends: the user's model (or the
embedded default, or a server already running) resolved into an EngineSpec; the workload
loaded into the request schedule every launch sends; the warning about sampling on vLLM's
CPU build, said once up front."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tuner import checks, engine_cmdline
from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    RequestSchedule,
    Workload,
    WorkloadSpec,
)
from tuner.records.options import EngineOptions

Say = Callable[[str], None]
_log = logging.getLogger(__name__)


def resolve_engine(engine: EngineOptions) -> EngineSpec:
    """The engine to launch (or, with `base_url`, the server already running) on this
    machine: the user's model, or the embedded default with the CPU engine's flags where
    there is no GPU."""
    from tuner.measure import machine
    from tuner.measure import model as embedded

    if engine.base_url is not None:
        checks.live_engine_options(engine)
        spec = machine.live_engine(engine.base_url, model=engine.model,
                                   tokenizer=engine.tokenizer,
                                   request_timeout_s=engine.request_timeout_s,
                                   level_timeout_s=engine.level_timeout_s)
    else:
        spec = checks.engine_spec(
            engine, gpu=machine.has_nvidia_gpu(),
            embedded_model=None if engine.model else str(embedded.embedded_model_dir()))
    _log.debug("engine: model %s, command %s, args %s, env %s, device %s", spec.model,
               " ".join(spec.vllm_cmd) or "(default)", " ".join(spec.extra_args) or "none",
               spec.env or "none", spec.device)
    return spec


def load_workload(workload: WorkloadSpec, engine: EngineSpec, settings: MeasureSettings,
                   say: Say, *, sample: bool = False) -> tuple[Workload, RequestSchedule]:
    """The prompts (as many as the levels, their warm-ups and the workload sample ask for,
    where the data holds them) and the request schedule every launch sends
    (tuner.measure.request_schedule), with the workload sample a study's first baseline also
    sends where `sample`; said once, up front, where levels are shortened, prompts repeat or
    the sample is short."""
    from tuner.measure import request_schedule, workloads

    wl = workloads.load(workload, tokenizer=engine.tokenizer or engine.model,
                        pool=settings.pool_size(workload.num_prompts),
                        max_model_len=engine_cmdline.engine_limits(engine).max_model_len,
                        say=say)
    schedule, note = request_schedule.build(wl, settings)
    for line in (note, request_schedule.sample_note(wl, schedule, settings) if sample else None):
        if line:
            say(line)
    return wl, schedule if sample else schedule.without_sample()


def warn_sampling(engine: EngineSpec, workload: WorkloadSpec, say: Say) -> None:
    """Once, up front: speculative launches on vLLM's CPU build sample wrongly at temperature
    above 0 (tuner.replay.sampling.known_defect)."""
    from tuner.replay import sampling
    from tuner.speculative.schema import vllm_version

    if not engine.base_url and (text := sampling.known_defect(
            device=engine.device, temperature=workload.temperature,
            version=None if engine.vllm_cmd else vllm_version())):
        say(text)
