"""Measure stage: the engine path one vLLM server took, and how to put a baseline on it.

Speculation can move vLLM off its fastest path (vLLM 0.26 on a GPU: n-gram turns async
scheduling off and falls back from the V2 to the V1 model runner), so "speculation vs no
speculation" mixes the path's cost with speculation's gain. This module reads the path from
what the server printed and says which flags and environment put a no-speculation engine
on the speculative engine's path.

Promises: values are normalized (model_runner 'V1'|'V2', async_scheduling 'true'|'false',
cudagraph_mode as vLLM's CUDAGraphMode name, attention_backend as vLLM's backend name) and
come from vLLM's own lines where it prints them: the "non-default args" summary, the engine's
"with config:" line, the runner and scheduling lines of vLLM 0.26 and 0.32 alike. Where no
line says a value, it is the default that version's source takes (named in `inferred`). vLLM
serves no path on /metrics (only cache_config_info) nor on /version, so the log is the source.

An n-gram launch also records which n-gram proposer it ran (`ngram_path`, which
tuner.replay.predict models): no vLLM line names the proposer, so it is the runner's, by vLLM
0.32's source (and 0.26's, which never builds V2 for n-gram): the V1 runner runs method
`ngram` on its numba proposer (v1/worker/gpu_model_runner.py: `method == "ngram"` ->
NgramProposer) and `ngram_gpu` on v1/spec_decode/ngram_proposer_gpu.py; the V2 runner runs
both on its Triton scan (v1/worker/gpu/spec_decode/__init__.py, `use_ngram()` ->
NgramGPUSpeculator). Where the runner is unknown, so is the proposer.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping

from tuner import engine_cmdline
from tuner.records.configs import Frozen, TrialConfig

FIELDS = ("model_runner", "async_scheduling", "cudagraph_mode", "attention_backend")
INFERRED_KEY = "inferred"  # in EngineInfo.details: the FIELDS that no log line stated
# In EngineInfo.details of an n-gram launch: "V1" (numba), "V2" (Triton scan), "V1-gpu" (the V1
# runner's ngram_gpu proposer, which the replay does not model); inferred with the runner.
NGRAM_PATH_KEY = "ngram_path"
NGRAM_PATHS = ("V1", "V2", "V1-gpu")
# vllm/envs.py of 0.26 and 0.32: unset = vLLM decides; "0"/"1" forces V1/V2 (bool(int(value))).
MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# The lines, from vLLM's format strings (0.26.0 and 0.32.0 unless a version is named):
# v1/worker/{gpu,cpu,xpu}_worker.py logs at INFO when it builds the V2 runner, and only then.
_V2_RUNNER = re.compile(r"Using V2 Model Runner")
# config/vllm.py use_v2_model_runner: "Model Runner V2 does not yet support %s; using the V1
# model runner instead." and "Model Runner V2 requires Triton; using the V1 model runner instead."
_V1_RUNNER = re.compile(r"using the V1 model runner instead")
# config/vllm.py, 0.26 only, after the decision: "Asynchronous scheduling is %s."
_ASYNC_FINAL = re.compile(r"Asynchronous scheduling is (enabled|disabled)\.")
# config/vllm.py: every automatic refusal ("Async scheduling not supported with %s-based
# speculative decoding and will be disabled.", "... will be disabled because ...", "Async
# scheduling is disabled because the V1 model runner ..." (0.32), ROCm DeepEP ...).
_ASYNC_OFF = re.compile(r"Async scheduling (?:not supported|is not compatible|will be disabled|"
                        r"is disabled)")
# v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: %s" (VllmConfig.__str__).
_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: (.*)")
_CUDAGRAPH_CONFIG = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
# config/compilation.py, while the runner sets up attention (after the config line), e.g.
# "CUDAGraphMode.FULL is not supported with X backend ...; setting cudagraph_mode=PIECEWISE".
_CUDAGRAPH_SET = re.compile(r"; setting cudagraph_mode=(\w+)")
_DEVICE = re.compile(r"\bdevice_config=(\w+)")
# The config line's SpeculativeConfig.__repr__ (config/speculative.py of 0.26 and 0.32):
# "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)".
_SPEC_METHOD = re.compile(r"speculative_config=SpeculativeConfig\(method='([\w-]+)'")
# platforms/cuda.py: "Using %s attention backend out of potential backends: %s." (automatic)
# and "Using %s backend." (--attention-backend; %s of the enum may print its class name).
_ATTENTION_AUTO = re.compile(r"Using (\w+) attention backend out of potential backends")
_ATTENTION_SELECTED = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) backend\.")
# entrypoints/serve/utils/api_utils.py: "non-default args: %s" (a dict's repr).
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$", re.M)
_INFO = re.compile(r"\bINFO\b")
_VERSION = re.compile(r"(?:vLLM API server version |LLM engine \(v|█ +version )([\w.+-]+)")
_SETTINGS = {"enforce_eager": re.compile(r"\benforce_eager=(\w+)"),
             "dtype": re.compile(r"\bdtype=torch\.(\w+)")}


class EnginePath(Frozen):
    """The path of one engine; None: not known (no line, and no default to infer)."""

    model_runner: str | None = None  # 'V1' | 'V2'
    async_scheduling: str | None = None  # 'true' | 'false'
    cudagraph_mode: str | None = None  # vLLM's CUDAGraphMode name: NONE, PIECEWISE, ...
    attention_backend: str | None = None  # vLLM's AttentionBackendEnum name
    inferred: tuple[str, ...] = ()  # the fields taken from vLLM's defaults, not from a line
    # An n-gram launch's proposer (NGRAM_PATHS), from its runner; None: no n-gram, or not known.
    # Not a field alignment compares: a baseline runs no proposer.
    ngram_path: str | None = None

    def details(self) -> dict[str, str]:
        """As EngineInfo.details stores it (strings only)."""
        out = {f: v for f in FIELDS if (v := getattr(self, f)) is not None}
        if self.ngram_path is not None:
            out[NGRAM_PATH_KEY] = self.ngram_path
        if self.inferred:
            out[INFERRED_KEY] = ",".join(self.inferred)
        return out

    @classmethod
    def from_details(cls, details: Mapping[str, object] | None) -> EnginePath:
        """Back from EngineInfo.details, also as older tuners stored them ("disabled",
        "False", "V1") before values were normalized."""
        d = dict(details or {})
        inferred = tuple(x for x in str(d.get(INFERRED_KEY) or "").split(",")
                         if x in (*FIELDS, NGRAM_PATH_KEY))
        ngram = str(d.get(NGRAM_PATH_KEY) or "")
        runner = str(d.get("model_runner") or "").upper() or None
        flag = {"true": "true", "enabled": "true", "false": "false",
                "disabled": "false"}.get(str(d.get("async_scheduling") or "").lower())
        return cls(model_runner=runner if runner in ("V1", "V2") else None,
                   async_scheduling=flag, inferred=inferred,
                   cudagraph_mode=_str_or_none(d.get("cudagraph_mode")),
                   attention_backend=_str_or_none(d.get("attention_backend")),
                   ngram_path=ngram if ngram in NGRAM_PATHS else None)

    def describe(self) -> str:
        """One line, e.g. "runner V1, async scheduling false, CUDA graphs PIECEWISE,
        attention FLASH_ATTN (inferred: runner)"."""
        names = {"model_runner": "runner", "async_scheduling": "async scheduling",
                 "cudagraph_mode": "CUDA graphs", "attention_backend": "attention",
                 NGRAM_PATH_KEY: "n-gram proposer"}
        parts = [f"{names[f]} {getattr(self, f) or '?'}" for f in FIELDS]
        if self.ngram_path is not None:
            parts.append(f"{names[NGRAM_PATH_KEY]} {self.ngram_path}")
        guessed = [names[f] for f in self.inferred]
        return ", ".join(parts) + (f" (inferred: {', '.join(guessed)})" if guessed else "")


class Difference(Frozen):
    """One field of the path on which the two engines differ."""

    field: str
    baseline: str
    speculative: str

    def __str__(self) -> str:
        return f"{self.field}: {self.baseline} without speculation, {self.speculative} with it"


class Alignment(Frozen):
    """What puts a no-speculation engine on the speculative engine's path: `engine_args`
    (each one argv item, `--flag` or `--flag=value`, so argparse and vLLM read it whole),
    `engine_env` (set in the engine's environment) and the `differences` they undo."""

    engine_args: tuple[str, ...]
    engine_env: dict[str, str]
    differences: tuple[Difference, ...]

    def trial_config(self) -> TrialConfig:
        """The aligned baseline as a trial: no speculation, these flags and environment."""
        args = {f.name.replace("-", "_"): True if f.value is None else f.value
                for f in engine_cmdline.parse_flags(self.engine_args)}
        return TrialConfig(engine_args=args, engine_env=dict(self.engine_env))

    def describe(self) -> str:
        return "; ".join(map(str, self.differences))


def alignment(baseline: EnginePath, speculative: EnginePath) -> Alignment | None:
    """The flags and environment that put a no-speculation engine on `speculative`'s path,
    given the plain baseline's `baseline` path; None when the two paths do not differ.

    Only fields known on both sides count: an unknown one is no evidence of a difference.
    Both vLLM 0.26 and 0.32 take `--[no-]async-scheduling`, `--attention-backend`,
    `--compilation-config` and VLLM_USE_V2_MODEL_RUNNER (engine/arg_utils.py, envs.py)."""
    diffs = tuple(Difference(field=f, baseline=b, speculative=s) for f in FIELDS
                  if (b := getattr(baseline, f)) is not None
                  and (s := getattr(speculative, f)) is not None and b != s)
    if not diffs:
        return None
    args: list[str] = []
    env: dict[str, str] = {}
    for d in diffs:
        if d.field == "async_scheduling":
            args.append("--async-scheduling" if d.speculative == "true" else
                        "--no-async-scheduling")
        elif d.field == "model_runner":
            env[MODEL_RUNNER_ENV] = "1" if d.speculative == "V2" else "0"
        elif d.field == "cudagraph_mode":
            args.append("--compilation-config=" + json.dumps({"cudagraph_mode": d.speculative}))
        elif d.field == "attention_backend":
            args.append(f"--attention-backend={d.speculative}")
    return Alignment(engine_args=tuple(args), engine_env=env, differences=diffs)


def read_log(text: str, *, env: Mapping[str, str] | None = None) -> EnginePath:
    """The path an engine took, from its log (vLLM 0.26 and 0.32 wording) and the environment
    it was started with (`env`: only VLLM_USE_V2_MODEL_RUNNER is read)."""
    vllm_log = bool(_CONFIG_LINE.search(text) or _NON_DEFAULT.search(text))
    if not vllm_log:
        return EnginePath()
    config = _last(_CONFIG_LINE, text) or ""
    device = (_last(_DEVICE, config) or "").lower()
    # Each reading: (the value, whether it was inferred rather than said by a line)
    runner = _model_runner(text, env or {})
    flag = _async_scheduling(text, device)
    cudagraph = _cudagraph_mode(text, config, device)
    attention = _attention_backend(text, device)
    ngram = _ngram_path(_spec_method(text, config), runner[0])
    inferred = tuple(name for name, (_, guessed) in (
        ("model_runner", runner), ("async_scheduling", flag), ("cudagraph_mode", cudagraph),
        ("attention_backend", attention), (NGRAM_PATH_KEY, (ngram, runner[1] and bool(ngram))))
        if guessed)
    return EnginePath(model_runner=runner[0], async_scheduling=flag[0],
                      cudagraph_mode=cudagraph[0], attention_backend=attention[0],
                      inferred=inferred, ngram_path=ngram)


def _spec_method(text: str, config: str) -> str | None:
    """The speculative method the engine was configured with: its config line's
    SpeculativeConfig, else the non-default args' speculative_config (the line is cut)."""
    if (method := _last(_SPEC_METHOD, config)) is not None:
        return method
    spec = _non_default_args(text).get("speculative_config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return None
    return spec.get("method") if isinstance(spec, dict) else None


def ngram_path_of(details: Mapping[str, object] | None, method: str | None) -> str | None:
    """An n-gram launch's proposer from its stored EngineInfo.details: as recorded, else (a
    launch stored before the proposer was recorded) by the same rule from the runner the
    details hold and the launch's method; None where neither says."""
    path = EnginePath.from_details(details)
    return path.ngram_path or _ngram_path(method, path.model_runner)


def _ngram_path(method: str | None, runner: str | None) -> str | None:
    """The n-gram proposer an engine with this method and runner builds (the module docstring
    names vLLM's lines); None where it runs no n-gram or the runner is not known."""
    if method not in ("ngram", "ngram_gpu") or runner not in ("V1", "V2"):
        return None
    if runner == "V2":
        return "V2"
    return "V1" if method == "ngram" else "V1-gpu"


_Reading = tuple[str | None, bool]  # a value of the path, and whether it was inferred


def _model_runner(text: str, env: Mapping[str, str]) -> _Reading:
    """The worker that builds V2 says so at INFO; the V1 fallbacks warn. Neither line (the
    aligned baseline, VLLM_USE_V2_MODEL_RUNNER=0, or a model V2 does not take by default)
    means V1, provided INFO lines reach the log at all."""
    runner = "V2" if _V2_RUNNER.search(text) else "V1" if _V1_RUNNER.search(text) else None
    if runner is not None:
        return runner, False
    forced = env.get(MODEL_RUNNER_ENV, "").strip()
    if forced.lstrip("-").isdigit():
        runner = "V2" if int(forced) else "V1"
    elif _INFO.search(text):
        runner = "V1"
    return runner, runner is not None


def _async_scheduling(text: str, device: str) -> _Reading:
    """The CPU platform turns it off after the decision, silently (both versions'
    platforms/cpu.py); 0.26 then logs its decision; both warn when they refuse it; otherwise
    it is on unless the user turned it off (0.32 logs nothing when on)."""
    final = _last(_ASYNC_FINAL, text)
    refused = _ASYNC_OFF.search(text)
    asked = _non_default_args(text).get("async_scheduling")
    if device == "cpu":
        return "false", not (refused or final == "disabled" or asked is False)
    if final is not None:
        return ("true" if final == "enabled" else "false"), False
    if refused:
        return "false", False
    if isinstance(asked, bool):
        return ("true" if asked else "false"), False
    return "true", True


def _cudagraph_mode(text: str, config: str, device: str) -> _Reading:
    """The config line holds the mode vLLM resolved; the runner may lower it afterwards for
    the attention backend (spec decode's uniform batches), and says so."""
    cudagraph = _last(_CUDAGRAPH_SET, text) or _last(_CUDAGRAPH_CONFIG, config)
    if cudagraph is not None or device != "cuda":
        return cudagraph, False
    # 0.26 prints the compilation config with exclude_unset (its H200 lines did state the
    # mode); where a line has none, the default level (O2) sets FULL_AND_PIECEWISE on CUDA,
    # and enforce_eager turns graphs off.
    eager = _last(_SETTINGS["enforce_eager"], config)
    return ("NONE" if eager == "True" else "FULL_AND_PIECEWISE"), True


def _attention_backend(text: str, device: str) -> _Reading:
    attention = _first(_ATTENTION_AUTO, text) or _first(_ATTENTION_SELECTED, text)
    if attention is None and device == "cpu":
        # platforms/cpu.py returns CPU_ATTN for every non-MLA model without a line (the MLA
        # backends log "Using %s backend.").
        return "CPU_ATTN", True
    return attention, False


def log_version(text: str) -> str | None:
    """vLLM's version as its start-up lines print it (a fallback: GET /version says it)."""
    return _first(_VERSION, text)


def log_settings(text: str) -> dict[str, str]:
    """Other settings of the engine's config line worth keeping beside the path."""
    config = _last(_CONFIG_LINE, text) or ""
    return {k: m.group(1) for k, p in _SETTINGS.items() if (m := p.search(config))}


def _non_default_args(text: str) -> dict[str, object]:
    found = _last(_NON_DEFAULT, text)
    if not found:
        return {}
    try:
        value = ast.literal_eval(found)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    return m.group(1) if m else None


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    found = list(pattern.finditer(text))
    return found[-1].group(1) if found else None


def _str_or_none(value: object) -> str | None:
    return str(value) if value not in (None, "") else None
