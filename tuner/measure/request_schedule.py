"""Measure stage, the request schedule: which prompt every request of a launch sends.

One schedule per study, built here once from the workload (its prompts in their seeded order)
and the settings, stored with the study and sent by every launch: per level, in the order of
`--concurrency`, its warm-ups and then its measured requests, each a distinct prompt, disjoint
across levels and warm-ups. So every config at a level is measured on the same requests in the
same order, and the engine's state at each request (prefix cache, suffix decoding's tree) is
the same for every config except for what the config itself changes. `tuner bench` builds it
the same way, so a verify command measures what the study measured.

Where the data holds fewer distinct prompts than the levels ask for, the measured requests of
every level are shortened in proportion (warm-ups kept), never wrapped; `--allow-repeats`
wraps instead, for traffic that truly repeats (suffix decoding then learns from the repeats).
`fresh` builds the schedule `tuner verify` sends: a study's levels over prompts it never sent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tuner.errors import ConfigError
from tuner.measure.workloads import BUNDLED
from tuner.records.configs import LevelRequests, MeasureSettings, Prompt, RequestSchedule, Workload


def build(workload: Workload, settings: MeasureSettings) -> tuple[RequestSchedule, str | None]:
    """The schedule for `workload` under `settings`, and one line where a level was shortened
    or, with --allow-repeats, prompts repeat (None where every level got what it asked for)."""
    distinct = len(workload.prompts)
    if not distinct:
        raise ConfigError(f"{_source(workload)} has no prompts to send. Check --dataset-path "
                          f"and the workload's filters (--max-input-tokens, --category).")
    levels = settings.concurrencies
    warm = [settings.warmups_for(c) for c in levels]
    asked = [settings.requests_for(c, workload.spec.num_prompts) for c in levels]
    measured = list(asked)
    if not settings.allow_repeats and sum(warm) + sum(asked) > distinct:
        room = distinct - sum(warm)
        if room < len(levels):
            raise ConfigError(
                f"{_source(workload)} has {distinct} distinct prompts, but the levels "
                f"{','.join(map(str, levels))} need {sum(warm)} warm-ups and at least one "
                f"measured request each, none sent twice. Use {_more(workload)}, fewer "
                f"--concurrency levels or --num-warmups, or --allow-repeats (suffix decoding "
                f"then learns from the repeats).")
        measured = _shortened(asked, room)
    cursor, out = 0, []
    for c, w, m, a in zip(levels, warm, measured, asked, strict=True):
        ids = [i % distinct for i in range(cursor, cursor + w + m)]
        cursor += w + m
        out.append(LevelRequests(concurrency=c, warmups=tuple(ids[:w]),
                                 measured=tuple(ids[w:]), asked=None if m == a else a))
    # The workload sample: the prompts no level sends, as many as asked for and left once as
    # many as the levels send are kept for an out-of-sample check (tuner verify).
    sample = tuple(range(cursor, min(distinct - _reserve(settings, cursor),
                                     cursor + settings.sample_prompts)))
    schedule = RequestSchedule(workload_digest=workload.digest, levels=tuple(out),
                               allow_repeats=settings.allow_repeats, sample=sample,
                               sample_concurrency=settings.sample_concurrency()
                               if sample else None)
    return schedule, _shortened_note(workload, schedule, warm=sum(warm), asked=sum(asked))


def _reserve(settings: MeasureSettings, levels: int) -> int:
    """Prompts the workload sample leaves for an out-of-sample check: as many as the levels
    send (`levels`), where a sample is asked for."""
    return levels if settings.sample_prompts else 0


def sample_note(workload: Workload, schedule: RequestSchedule, settings: MeasureSettings
                ) -> str | None:
    """One line where the workload sample is smaller than --sample-prompts asked for (said
    by a study, whose first baseline sends it; `tuner bench` never does)."""
    asked = settings.sample_prompts
    if not asked or len(schedule.sample) >= asked:
        return None
    held = (f"holds {len(schedule.sample)} of the {asked} prompts asked for" if schedule.sample
            else f"is empty ({asked} prompts asked for)")
    levels = sum(len(lv.warmups) + len(lv.measured) for lv in schedule.levels)
    return (f"The workload sample (--sample-prompts) {held}: {_source(workload)} has "
            f"{len(workload.prompts)} distinct prompts, the levels send {levels} and "
            f"{_reserve(settings, levels)} are kept for an out-of-sample check (tuner verify). "
            f"For a larger sample: {_more(workload)}.")


def used(schedule: RequestSchedule) -> frozenset[int]:
    """Every prompt index `schedule` names: each level's warm-ups and measured requests, and
    the workload sample the study's baseline sent."""
    return frozenset(i for lv in schedule.levels for i in lv.warmups + lv.measured) | \
        frozenset(schedule.sample)


def sent_before(pool: Workload, sent: Workload, schedule: RequestSchedule) -> frozenset[int]:
    """The indices of `pool`'s prompts that `schedule` sent from `sent` (the study's workload,
    whose indices it names), matched by text: a prompt the data holds twice, or a pool drawn
    in another order, is still found."""
    texts = {sent.prompts[i].prompt for i in used(schedule) if i < len(sent.prompts)}
    return frozenset(i for i, p in enumerate(pool.prompts) if p.prompt in texts)


def fresh(workload: Workload, like: RequestSchedule, *, exclude: Collection[int],
          measured: int | None = None) -> RequestSchedule:
    """`like`'s levels, in its order, with its warm-ups and measured requests per level
    (`measured`: that many at every level instead), over the prompts of
    `workload` whose indices are not in `exclude`, none sent twice. Where too few are left,
    measured requests are shortened in proportion (a level's `asked` says what it asked for)."""
    left = [i for i in range(len(workload.prompts)) if i not in set(exclude)]
    warm = [len(lv.warmups) for lv in like.levels]
    asked = [measured or len(lv.measured) for lv in like.levels]
    counts = list(asked)
    if sum(warm) + sum(asked) > len(left):
        room = len(left) - sum(warm)
        if room < len(like.levels):
            raise ConfigError(
                f"{_source(workload)} holds {len(left)} prompts the study never sent, but its "
                f"levels {','.join(str(lv.concurrency) for lv in like.levels)} need "
                f"{sum(warm)} warm-ups and at least one measured request each. Use fewer "
                f"--num-prompts, or a study run with {_more(workload)}.")
        counts = _shortened(asked, room)
    cursor, out = 0, []
    for lv, w, m, a in zip(like.levels, warm, counts, asked, strict=True):
        ids = left[cursor:cursor + w + m]
        cursor += w + m
        out.append(LevelRequests(concurrency=lv.concurrency, warmups=tuple(ids[:w]),
                                 measured=tuple(ids[w:]), asked=None if m == a else a))
    return RequestSchedule(workload_digest=workload.digest, levels=tuple(out))


def _shortened(asked: Sequence[int], room: int) -> list[int]:
    """Measured requests per level that fit `room` prompts: each level in proportion to what
    it asked for (at least one), the remainder to the largest fractions first."""
    total = sum(asked)
    share = [a * room / total for a in asked]
    out = [max(1, int(x)) for x in share]
    by_fraction = sorted(range(len(asked)), key=lambda i: share[i] - int(share[i]), reverse=True)
    for i in by_fraction:
        if sum(out) >= room:
            break
        if out[i] < asked[i]:
            out[i] += 1
    while sum(out) > room:  # the floors of one took more than their share
        i = max(range(len(out)), key=lambda j: out[j])
        out[i] -= 1
    return out


def _shortened_note(workload: Workload, schedule: RequestSchedule, *, warm: int, asked: int
                    ) -> str | None:
    short = [lv for lv in schedule.levels if lv.asked is not None]
    if schedule.allow_repeats:
        again = schedule.requests - len(set(i for lv in schedule.levels
                                            for i in lv.warmups + lv.measured))
        if not again:
            return None
        return (f"--allow-repeats: {again} of the {schedule.requests} requests each engine sends "
                f"repeat a prompt ({_source(workload)} has {len(workload.prompts)} distinct); "
                f"suffix decoding and the prefix cache learn from the repeats.")
    if not short:
        return None
    per = ", ".join(f"c={lv.concurrency} {len(lv.measured)} of {lv.asked}" for lv in short)
    return (f"Levels shortened so no engine sees a prompt twice: {_source(workload)} has "
            f"{len(workload.prompts)} distinct prompts for {warm} warm-ups and {asked} measured "
            f"requests; measured requests {per}. For full levels: {_more(workload)}, or "
            f"--allow-repeats.")


def _source(workload: Workload) -> str:
    spec = workload.spec
    if spec.dataset_path is None and spec.name in BUNDLED:
        return f"{spec.name}'s bundled sample"
    return f"workload '{spec.name}'"


def _more(workload: Workload) -> str:
    spec = workload.spec
    if spec.dataset_path is None and spec.name in BUNDLED:
        return "--dataset-path FILE with the full dataset"
    return "a larger dataset"


def warmups(workload: Workload, level: LevelRequests, settings: MeasureSettings) -> list[Prompt]:
    """The level's warm-up requests as sent: short (`warmup_output_len`), never measured."""
    return [p.model_copy(update={"output_len": min(p.output_len, settings.warmup_output_len)})
            for p in (workload.prompts[i] for i in level.warmups)]


def sample(workload: Workload, schedule: RequestSchedule) -> list[Prompt]:
    """The workload sample's requests in send order."""
    return [workload.prompts[i] for i in schedule.sample]


def measured(workload: Workload, level: LevelRequests) -> list[Prompt]:
    """The level's measured requests in send order (request i sends the i-th)."""
    return [workload.prompts[i] for i in level.measured]


def check_workload(schedule: RequestSchedule, workload: Workload) -> None:
    """Refuse a stored schedule whose workload is not `workload` (other prompts, or another
    order): its indices would name other requests."""
    if schedule.workload_digest != workload.digest:
        raise ConfigError(
            f"The study's request schedule was built for workload {schedule.workload_digest}, "
            f"but these options give workload {workload.digest} (other prompts or another "
            f"order). Resume with the same workload options, or pass --study-name NEW to "
            f"start a new study.")
