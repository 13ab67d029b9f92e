"""Search stage, fan-out: where trials run. Inline in the driver (a CPU machine, or one GPU
without Ray) or as Ray tasks, one per GPU set, on this machine or a cluster.

Promises: ask/tell stays in the driver; every submitted trial comes back as a TrialOutcome,
also when its Ray worker died (a failure of kind worker_died), so a trial is never lost.
"""

from __future__ import annotations

from typing import Any

from tuner.errors import ConfigError
from tuner.measure.trial import measure_outcome
from tuner.records import EngineSpec, Failure, TrialOutcome


def choose(engine: EngineSpec, *, ray_address: str | None, parallel: int | None,
           logical_gpus: int | None) -> InlineExecutor | RayExecutor:
    """Ray when asked for (an address, --parallel, logical GPUs) or on a GPU machine where it
    is installed; inline otherwise."""
    want_ray = bool(ray_address or logical_gpus or (parallel or 1) > 1)
    if want_ray or engine.device == "cuda":
        try:
            import ray  # noqa: F401
        except ImportError:
            if want_ray:
                raise ConfigError("Ray is not installed, and --ray-address/--parallel need it. "
                                  "`pip install ray` (or the offline bundle's ray wheel)."
                                  ) from None
            return InlineExecutor()  # one GPU and no Ray: one trial at a time, as on a CPU
        return RayExecutor(address=ray_address, parallel=parallel, num_gpus=logical_gpus)
    return InlineExecutor()


class InlineExecutor:
    """Runs each trial in the driver process, one at a time (CPU machines, no GPU to share)."""

    parallel = 1

    def __init__(self) -> None:
        self._done: list[tuple[object, TrialOutcome]] = []

    def submit(self, key: object, *args: Any, num_gpus: float = 0) -> None:
        self._done.append((key, measure_outcome(*args)))

    def wait_one(self) -> tuple[object, TrialOutcome]:
        return self._done.pop(0)

    def pending(self) -> int:
        return len(self._done)

    def shutdown(self) -> None:
        pass


class RayExecutor:
    """One Ray task per trial holding `num_gpus` GPUs; at most `parallel` in flight.

    Ask/tell stays in the driver; a worker that dies is reported as a failure of its trial.
    """

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

    def submit(self, key: object, *args: Any, num_gpus: float = 1) -> None:
        ref = self._remote.options(num_gpus=num_gpus, num_cpus=1).remote(*args)
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
