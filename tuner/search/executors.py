"""Search stage, fan-out: where trials run. Inline in the driver by default (a CPU machine or
one GPU: Ray is optional), or, when asked for, as Ray tasks, one per GPU set, on this machine
or a cluster.

Promises: ask/tell stays in the driver; every submitted trial comes back as a TrialOutcome,
also when its Ray worker died (a failure of kind worker_died), so a trial is never lost.
"""

from __future__ import annotations

from typing import Any

from tuner import engine_cmdline
from tuner.errors import ConfigError
from tuner.measure.trial import measure_outcome
from tuner.records.configs import EngineSpec
from tuner.records.trials import Failure, TrialOutcome


def choose(engine: EngineSpec, *, ray_address: str | None, parallel: int | None,
           logical_gpus: int | None) -> InlineExecutor | RayExecutor:
    """Ray only when asked for (--ray-address, --parallel above 1, logical GPUs); inline
    otherwise, also on a GPU machine where ray is installed: one GPU or a CPU runs one trial
    at a time and needs no Ray."""
    wanted_by = [flag for flag, on in (("--ray-address", ray_address),
                                       (f"--parallel {parallel}", (parallel or 1) > 1),
                                       ("--logical-gpus", logical_gpus)) if on]
    if not wanted_by:
        return InlineExecutor()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{' and '.join(wanted_by)} run trials as Ray tasks, but Ray is not installed. "
            f"Install it with `pip install 'spec-tuner[ray]'` (on the offline GPU host: build "
            f"the bundle with scripts/gpu_bundle.sh --with-ray), or drop "
            f"{' and '.join(f.split()[0] for f in wanted_by)} to run one trial at a time "
            f"without Ray.") from None
    return RayExecutor(address=ray_address, parallel=parallel, num_gpus=logical_gpus)


def gpus_per_trial(engine: EngineSpec, *, asked: float | None, logical_gpus: int | None
                   ) -> float:
    """GPUs each trial holds on the executor (`--gpus-per-trial`): as asked, else the
    engine's tensor x pipeline parallel size on GPUs (or Ray's logical ones), none on the
    CPU."""
    if asked is not None:
        return asked
    if engine.device == "cuda" or logical_gpus:
        return float(engine_cmdline.gpus_per_engine(engine))
    return 0.0


class InlineExecutor:
    """Runs each trial in the driver process, one at a time (CPU machines, no GPU to share)."""

    parallel = 1
    reports_progress = True  # the trial's own lines (engine starting, ready, levels) reach us

    def __init__(self) -> None:
        self._done: list[tuple[object, TrialOutcome]] = []

    def submit(self, key: object, *args: Any, num_gpus: float = 0, schedule: Any = None,
               progress: Any = None, show_bar: bool = False) -> None:
        self._done.append((key, measure_outcome(*args, schedule=schedule, progress=progress,
                                                show_bar=show_bar)))

    def wait_one(self) -> tuple[object, TrialOutcome]:
        return self._done.pop(0)

    def pending(self) -> int:
        return len(self._done)

    def shutdown(self) -> None:
        pass


class RayExecutor:
    """One Ray task per trial holding `num_gpus` GPUs; at most `parallel` in flight.

    Ask/tell stays in the driver; a worker that dies is reported as a failure of its trial.
    Workers' output stays out of the driver's terminal (log_to_driver=False), so the driver
    says when it hands a trial out and when its outcome comes back.
    """

    reports_progress = False

    def __init__(self, *, address: str | None, parallel: int | None, num_gpus: int | None = None
                 ) -> None:
        import ray

        kwargs: dict = {"ignore_reinit_error": True, "log_to_driver": False,
                        "include_dashboard": False}
        if address:
            kwargs["address"] = address
        elif num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        if not ray.is_initialized():
            ray.init(**kwargs)
        total = int(ray.cluster_resources().get("GPU", 0))
        self.total_gpus = total
        self.parallel = max(1, min(parallel or max(total, 1), max(total, 1)))
        self._remote = ray.remote(max_retries=0)(measure_outcome)
        self._refs: dict = {}

    def submit(self, key: object, *args: Any, num_gpus: float = 1, schedule: Any = None
               ) -> None:
        ref = self._remote.options(num_gpus=num_gpus, num_cpus=1).remote(*args,
                                                                         schedule=schedule)
        self._refs[ref] = key

    def pending(self) -> int:
        return len(self._refs)

    def wait_one(self) -> tuple[object, TrialOutcome]:
        import ray

        ready, _ = ray.wait(list(self._refs), num_returns=1)
        ref = ready[0]
        key = self._refs.pop(ref)
        try:
            return key, ray.get(ref)
        except ray.exceptions.RayError as e:  # worker died, node lost, task cancelled
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            return key, TrialOutcome(failure=Failure(
                reason=f"Ray worker failed: {type(e).__name__}: {reason}", kind="worker_died",
                log_tail=str(e)[-2000:]))

    def shutdown(self) -> None:
        import ray

        for ref in list(self._refs):
            ray.cancel(ref, force=True)
        self._refs.clear()
