"""Input checks: every check of what a user typed, and the defaults that follow from the
engine and the machine, one module per concern: `bounds` (numbers), `converters` (text),
`files` (the output folder, a dataset, an acceptance profile), `engine` (the engine to launch,
levels against it and the open-file limit), `spec_config` (speculative configs as vLLM takes
them), `plans` (an options record resolved: the checks across options), `drafter` (a drafter of the
user's own against the target).

The CLI converts every option through a converter here as argparse parses it; the checks that
need several options, the machine or the engine run when tuner.api resolves an options record
(`bench_options`, `optimize_options`), before anything is printed or created. Nothing here
starts an engine or probes the machine: tuner.api hands in what the machine is (a GPU, the
embedded model's folder). Callers import the names from here.
"""

from tuner.checks.bounds import (
    BOUNDS,
    DAY_S,
    MAX_LEVEL,
    MAX_LEVELS,
    MAX_REQUESTS_PER_TRIAL,
    MAX_SEED,
    MAX_TOKENS,
    Bound,
    check,
    int_list,
    list_option,
    option,
    show,
    unknown_name,
)
from tuner.checks.converters import (
    PERCENTILE_METRICS,
    WORKLOADS,
    command_line,
    metric_percentiles,
    name_list,
    name_value,
    name_value_pairs,
    percentile_metrics,
    workload_name,
)
from tuner.checks.drafter import (
    EMBEDDED_DRAFT,
    VOCAB_PROBE,
    Vocabulary,
    draft_model_folder,
    draft_vocabulary,
)
from tuner.checks.engine import (
    CPU_DEFAULT_ARGS,
    CPU_ENV,
    OPEN_FILES_SPARE,
    check_levels_fit_engine,
    engine_spec,
    ensure_open_files,
    live_engine_options,
)
from tuner.checks.files import (
    DATASET_MAX_BYTES,
    DATASET_MAX_LINE_BYTES,
    acceptance_profile,
    dataset_file,
    dataset_path,
    dataset_size,
    dataset_stat,
    output_dir,
)
from tuner.checks.plans import (
    ALIGNED_MODES,
    aligned_baseline,
    bench_options,
    check_requests,
    check_sampling,
    ladder,
    ladder_fits,
    measurement,
    optimize_options,
    study_name,
    target_concurrency,
)
from tuner.checks.spec_config import (
    METHODS,
    NEEDS_MODEL,
    check_methods,
    speculative_config,
    vllm_accepts,
)

__all__ = [
    "EMBEDDED_DRAFT",
    "VOCAB_PROBE",
    "Vocabulary",
    "draft_model_folder",
    "draft_vocabulary",
    "acceptance_profile",
    "aligned_baseline",
    "ALIGNED_MODES",
    "bench_options",
    "Bound",
    "BOUNDS",
    "check",
    "check_levels_fit_engine",
    "check_methods",
    "check_requests",
    "check_sampling",
    "command_line",
    "CPU_DEFAULT_ARGS",
    "CPU_ENV",
    "dataset_file",
    "DATASET_MAX_BYTES",
    "DATASET_MAX_LINE_BYTES",
    "dataset_path",
    "dataset_size",
    "dataset_stat",
    "DAY_S",
    "engine_spec",
    "ensure_open_files",
    "int_list",
    "ladder",
    "ladder_fits",
    "list_option",
    "live_engine_options",
    "MAX_LEVEL",
    "MAX_LEVELS",
    "MAX_REQUESTS_PER_TRIAL",
    "MAX_SEED",
    "MAX_TOKENS",
    "measurement",
    "METHODS",
    "metric_percentiles",
    "name_list",
    "name_value",
    "name_value_pairs",
    "NEEDS_MODEL",
    "OPEN_FILES_SPARE",
    "optimize_options",
    "option",
    "output_dir",
    "PERCENTILE_METRICS",
    "percentile_metrics",
    "show",
    "speculative_config",
    "study_name",
    "target_concurrency",
    "unknown_name",
    "vllm_accepts",
    "workload_name",
    "WORKLOADS",
]
