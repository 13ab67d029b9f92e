"""Bad input at the loaders, generated: whatever a user hands us, only a ConfigError with a
message comes out (the CLI turns it into one line and exit status 2). Any other exception is a
bug in the loader.

Loaders: search spaces (tuner.search.space.parse and .load), dataset files (tuner.measure.workloads.read_rows
and .load of a custom workload with the packaged tokenizer), --speculative-config
(tuner.checks.speculative_config) and --concurrency (tuner.checks.int_list). Every numeric
option of the CLI goes through tuner.cli.main itself, with the first stage after every check
replaced by a recorder: it either gets there with a value inside its tuner.checks bound, or
exits 2 with exactly one "tuner: error:" line. How many inputs each property tried and how
they ended is printed once the session ends (tests/conftest.py `terminal_summary`), whatever
order the tests ran in; a property that tried none fails.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from conftest import terminal_summary
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tuner import api, cli
from tuner import checks as bounds
from tuner.errors import ConfigError
from tuner.measure import workloads
from tuner.records.configs import WorkloadSpec
from tuner.search import space
from tuner.search import study as study_module
from tuner.speculative.schema import vllm_schema

PROPERTY = settings(max_examples=200, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TRIED: dict[str, Counter] = defaultdict(Counter)
_DIR = Path(tempfile.mkdtemp(prefix="bad-input-"))
atexit.register(shutil.rmtree, _DIR, True)


def tried_report() -> str:
    """How many inputs each property tried, and how they ended."""
    lines = [f"{name}: {sum(c.values())} tried ({c['ConfigError']} ConfigError, "
             f"{c['accepted']} accepted)" for name, c in sorted(TRIED.items())]
    return "bad-input properties:\n  " + "\n  ".join(lines) if lines else ""


@pytest.fixture(autouse=True)
def _each_property_tries_inputs(request: pytest.FixtureRequest):
    """A property (hypothesis) test must have sent its loader some input; the tally is
    printed at the end of the session."""
    terminal_summary(request.config, "bad-input properties", tried_report)
    before = sum(sum(c.values()) for c in TRIED.values())
    yield
    if getattr(request.function, "is_hypothesis_test", False):
        tried = sum(sum(c.values()) for c in TRIED.values()) - before
        assert tried > 0, f"{request.node.name} tried no input"


def only_config_error(name: str, load, *args, **kwargs):
    """Call a loader; a ConfigError must carry a message, anything else escapes (a bug)."""
    try:
        value = load(*args, **kwargs)
    except ConfigError as e:
        TRIED[name]["ConfigError"] += 1
        assert str(e).strip(), f"{name}: a ConfigError without a message"
        return None
    TRIED[name]["accepted"] += 1
    return value


def _file(name: str, content: str | bytes) -> Path:
    path = _DIR / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    return path


# --- strategies ---------------------------------------------------------------------------
# Any text, lone surrogates included (JSON can spell them as \udXXX escapes).
any_text = st.text(st.characters(blacklist_categories=()), max_size=40)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.integers().map(lambda i: i * 10**30), st.floats(), any_text)
json_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)), max_leaves=12)
# Python values YAML can produce: keys may be numbers, None or tuples too.
yaml_keys = st.one_of(any_text, st.integers(), st.none(), st.booleans(), st.floats())
yaml_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(yaml_keys, inner, max_size=4)), max_leaves=12)
deep = st.integers(500, 50_000).flatmap(
    lambda n: st.sampled_from(["[" * n, "{\"a\":" * n + "1" + "}" * n, "- " * n + "x"]))

PARAM_KEYS = ["type", "low", "high", "step", "log", "values", "at_most", "at_least", "bogus"]
param_values = st.one_of(scalars, st.sampled_from(["int", "float", "choice", "k", "lo"]),
                         st.lists(scalars, max_size=3))
param_spec = st.one_of(
    scalars, st.lists(scalars, max_size=3),
    st.dictionaries(st.sampled_from(PARAM_KEYS), param_values, max_size=6),
    st.fixed_dictionaries({"type": st.sampled_from(["int", "float"]),
                           "low": st.one_of(st.integers(-5, 10), st.floats()),
                           "high": st.one_of(st.integers(-5, 10), st.floats())},
                          optional={"step": st.floats(), "log": st.booleans(),
                                    "at_most": st.sampled_from(["k", "lo", "x"]),
                                    "at_least": st.sampled_from(["k", "lo", "x"])}))
params = st.dictionaries(st.one_of(st.sampled_from(["k", "lo", "model"]), yaml_keys),
                         param_spec, max_size=4)
method_names = st.one_of(st.sampled_from([*bounds.METHODS, "magic"]), yaml_keys)
space_like = st.one_of(
    yaml_like,
    st.fixed_dictionaries({"methods": st.one_of(
        st.dictionaries(method_names, st.one_of(st.none(), params, scalars), max_size=3),
        yaml_like)}, optional={
        "name": yaml_like, "description": yaml_like, "engine": st.one_of(params, yaml_like),
        "start_points": st.one_of(st.lists(st.one_of(
            st.dictionaries(yaml_keys, scalars, max_size=3), scalars), max_size=3), yaml_like),
        "extra": scalars}))


def _yaml_text(value) -> str:
    try:
        return yaml.safe_dump(value, allow_unicode=True)
    except yaml.YAMLError:
        return repr(value)


# Close to a real space (search_spaces/ngram.yaml), so the checks past the first get reached.
small_int = st.integers(-2, 12)
bound = st.one_of(small_int, small_int, small_int, st.floats(-2, 12),
                  st.sampled_from([float("nan"), float("inf"), "3"]))
near_valid_space = st.fixed_dictionaries({"methods": st.fixed_dictionaries({
    "ngram": st.fixed_dictionaries({
        "num_speculative_tokens": st.fixed_dictionaries(
            {"type": st.sampled_from(["int", "float", "choice", "intt"]), "low": bound,
             "high": bound}, optional={"step": bound, "log": st.booleans(),
                                       "values": st.lists(scalars, max_size=3)}),
        "prompt_lookup_max": st.one_of(bound, st.fixed_dictionaries(
            {"type": st.just("int"), "low": bound, "high": bound})),
        "prompt_lookup_min": st.fixed_dictionaries(
            {"type": st.just("int"), "low": bound, "high": bound},
            optional={"at_most": st.sampled_from(["prompt_lookup_max", "k",
                                                  "num_speculative_tokens"])}),
    })}, optional={"suffix": st.one_of(st.none(), params)})},
    optional={"engine": params, "start_points": st.lists(
        st.dictionaries(st.sampled_from(["method", "num_speculative_tokens"]), scalars),
        max_size=2)})

space_text = st.one_of(
    any_text, deep, space_like.map(_yaml_text), near_valid_space.map(_yaml_text),
    st.tuples(space_like.map(_yaml_text), st.integers(0, 200), any_text).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]),  # a valid file with something typed in
    st.sampled_from(["a: 2020-13-01", "methods: {ngram: {k: !!float abc}}", "a: !!timestamp x",
                     "!!python/object:os.system x", "? [a]\n: 1", "methods: *x", "\t- a"]))

rows = st.one_of(
    json_like,
    st.fixed_dictionaries({"prompt": st.one_of(any_text, scalars, json_like)}, optional={
        "output_tokens": st.one_of(scalars, st.integers(-3, 10**25)), "id": scalars}),
    st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=60)},  # mostly fine rows
                          optional={"output_tokens": st.integers(1, 64)}))
jsonl_text = st.one_of(
    any_text, deep,
    st.lists(rows, max_size=5).map(lambda rs: "\n".join(json.dumps(r) for r in rs)),
    st.lists(st.one_of(rows.map(json.dumps), any_text), max_size=5).map("\n".join))


# --- properties ---------------------------------------------------------------------------
@PROPERTY
@given(st.one_of(space_like, near_valid_space))
@example({"methods": {"ngram": {}}, "start_points": [{1: 2}]})  # non-string start-point key
@example({"methods": {"ngram": {}}, 1: None, None: 2})  # unsortable unknown keys
@example({"methods": {"ngram": {"k": {"type": "int", "low": float("nan"), "high": 3}}}})
def test_space_parse_raises_only_config_error(raw):
    sp = only_config_error("space.parse", space.parse, raw, source="<hypothesis>")
    if sp is not None:
        assert "none" in sp.methods


@PROPERTY
@given(st.one_of(space_text, st.binary(max_size=200)))
def test_space_load_raises_only_config_error(content):
    path = _file("space.yaml", content)
    only_config_error("space.load", space.load, str(path))


@PROPERTY
@given(st.one_of(jsonl_text, st.binary(max_size=200)), st.sampled_from([".jsonl", ".json"]))
def test_read_rows_raises_only_config_error(content, suffix):
    path = _file("rows" + suffix, content)
    out = only_config_error("workloads.read_rows", workloads.read_rows, path)
    if out is not None:
        assert all(isinstance(r, dict) for r in out)


@pytest.fixture(scope="module")
def cached_tokenizer():
    """The packaged tokenizer, loaded once: loading it per example would dominate the run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workloads, "load_tokenizer",
                   functools.lru_cache(maxsize=None)(workloads.load_tokenizer))
        yield


@PROPERTY
@given(jsonl_text, st.integers(1, 4), st.one_of(st.none(), st.integers(1, 64)))
@example('{"prompt": "\\ud800 lone surrogate"}', 1, None)  # crashed the tokenizer
@example('{"prompt": "a", "output_tokens": true}', 1, None)  # a bool is no token count
def test_custom_workload_raises_only_config_error(cached_tokenizer, content, n, output_len):
    path = _file("custom.jsonl", content)
    spec = WorkloadSpec(name="custom", dataset_path=str(path), num_prompts=n,
                        output_len=output_len)
    wl = only_config_error("workloads.load(custom)", workloads.load, spec,
                           tokenizer=workloads.EMBEDDED_TOKENIZER)
    if wl is not None:
        assert 1 <= len(wl.prompts) <= n
        assert all(p.prompt and p.prompt_len > 0 and p.output_len >= 1 for p in wl.prompts)


spec_texts = st.one_of(
    any_text, deep, json_like.map(json.dumps),
    st.dictionaries(st.sampled_from(["method", "num_speculative_tokens", "model"]),
                    st.one_of(json_like, st.sampled_from(list(bounds.METHODS))),
                    max_size=3).map(json.dumps),
    st.sampled_from(["none", " NULL ", "off", "", "null", "{}", "[]", "NaN", "1e999"]))


@PROPERTY
@given(spec_texts)
@example('{"method": []}')  # unhashable: `in METHODS` raised TypeError
def test_parse_spec_config_raises_only_config_error(text):
    value = only_config_error("settings.speculative_config", bounds.speculative_config, text)
    if value is not None:
        assert value["method"] in vllm_schema().methods and value["method"] != "none"


concurrency_texts = st.one_of(
    any_text, st.lists(st.one_of(st.integers(-5, 10**6), st.integers(), any_text,
                                 st.just(" 8 "), st.just("")), max_size=6).map(
        lambda xs: ",".join(map(str, xs))))


@PROPERTY
@given(concurrency_texts)
def test_parse_concurrency_raises_only_config_error(text):
    levels = only_config_error("settings.int_list", bounds.int_list, text, "concurrency")
    if levels is not None:
        assert levels and all(isinstance(c, int) and c >= 1 for c in levels)
        assert len(set(levels)) == len(levels)


# --- every numeric option of the CLI, through tuner.cli.main --------------------------------
class Reached(Exception):
    """A stage was about to run: every check passed."""


def _reached(*_args, **_kwargs):
    raise Reached


def _cli(argv: list[str]) -> tuple[int | None, str]:
    """tuner.cli.main(argv) with the first stage after every check replaced (loading the
    workload for bench and optimize, whose options tuner.api checks as it resolves them; the
    study for the commands that read one): (exit status or None if it got there, what it
    wrote to stderr)."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(workloads, "load", _reached)
        for name in ("policy", "predict"):
            mp.setattr(api, name, _reached)
        mp.setattr(study_module, "open_existing", _reached)
        try:
            rc = cli.main(argv)
        except Reached:
            rc = None
    return rc, err.getvalue()


LIST_OPTIONS = {"concurrency", "ladder", "k_values", "levels"}


def _numeric_options() -> list[tuple[str, str, str]]:
    """(command, flag, bound name) of every option whose value tuner.checks checks (under its
    first name: a deprecated alias is the same option)."""
    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, cli.argparse._SubParsersAction))
    out = []
    for command, parser in sub.choices.items():
        for action in parser._actions:
            name = getattr(action.type, "bound", None)
            if name:
                out.append((command, action.option_strings[0], name))
    return out


NUMERIC_OPTIONS = _numeric_options()
option_values = st.one_of(
    st.integers(), st.integers(-3, 5000), st.floats(), st.floats(-1e6, 1e6),
    st.sampled_from(["nan", "-nan", "inf", "-inf", "1e300", "1e-300", "-0", "0", "1", "0.5",
                     "2", "4096", "4097", "86400.5", "1,2", "1,2,1", "2,1", "", " 7 ", "0x10",
                     "1_000", "\u0661\u0662", "9" * 400, "9" * 5000]),
    any_text)


def _argv(command: str, flag: str, text: str) -> list[str]:
    where = ([str(_DIR / "study")] if command in ("policy", "recommend", "predict", "verify") else
             ["--model", str(workloads.EMBEDDED_TOKENIZER), "--output-dir", str(_DIR / "out")])
    extra = ["--policy"] if command == "optimize" and flag in _POLICY_FLAGS else []
    return [command, *where, *extra, f"{flag}={text}"]


_POLICY_FLAGS = {f for c, f, _ in NUMERIC_OPTIONS if c == "policy"}


def test_every_bound_is_an_option_and_every_numeric_option_is_bounded():
    assert {n for _, _, n in NUMERIC_OPTIONS} == set(bounds.BOUNDS)
    flags = {(c, f) for c, f, _ in NUMERIC_OPTIONS}
    for command, flag in [("bench", "--request-timeout"), ("optimize", "--n-trials"),
                          ("optimize", "--ladder-max"), ("policy", "--leaders"),
                          ("recommend", "--max-ttft-ms"), ("bench", "--concurrency"),
                          ("recommend", "--level"), ("predict", "--levels")]:
        assert (command, flag) in flags
    assert {n for _, _, n in NUMERIC_OPTIONS if n in LIST_OPTIONS} == LIST_OPTIONS


@PROPERTY
@given(st.sampled_from(NUMERIC_OPTIONS), option_values)
@example(("bench", "--request-timeout", "request_timeout"), "nan")
@example(("optimize", "--concurrency", "concurrency"), "100000")
@example(("optimize", "--timeout", "timeout"), "-1")
def test_every_numeric_option_passes_or_exits_2_in_one_line(option, value):
    command, flag, name = option
    text = str(value)
    argv = _argv(command, flag, text)
    rc, err = _cli(argv)
    if rc is None:
        TRIED["cli.main(numeric option)"]["accepted"] += 1
        got = getattr(cli.build_parser().parse_args(argv), name)
        if name in LIST_OPTIONS:
            # The levels the command read; empty --ladder/--k-values/--levels: the default.
            bound = bounds.BOUNDS[name]
            assert got is None or (got and all(bound.problem(v) is None for v in got)), got
        else:
            assert bounds.BOUNDS[name].problem(got) is None, (flag, text, got)
        assert err.count("tuner: error") == 0
        return
    TRIED["cli.main(numeric option)"]["ConfigError"] += 1
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("tuner: error: "), (argv, err)
    assert "Traceback" not in err


@PROPERTY
@given(st.lists(st.integers(-2, 5000), min_size=1, max_size=6), st.integers(1, 5000))
@example([16], 8)
@example([4096, 1], 4096)
def test_concurrency_above_max_num_seqs_is_refused(levels, max_num_seqs):
    text = ",".join(map(str, levels))
    rc, err = _cli(["bench", "--model", str(workloads.EMBEDDED_TOKENIZER), "--output-dir",
                    str(_DIR / "out"), f"--concurrency={text}",
                    f"--engine-args=--max-num-seqs {max_num_seqs}"])
    distinct = set(levels)
    pool = sum(max(16, 4 * c) + c for c in distinct)  # --num-prompts 16, 4 requests per slot
    fits = (min(levels) >= 1 and max(levels) <= min(max_num_seqs, 4096)
            and pool <= bounds.MAX_REQUESTS_PER_TRIAL)
    TRIED["cli.main(--concurrency vs --max-num-seqs)"]["accepted" if rc is None
                                                       else "ConfigError"] += 1
    assert (rc is None) == fits, (text, max_num_seqs, err)
    if not fits:
        assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
        if min(levels) >= 1 and max(levels) <= 4096 and pool <= bounds.MAX_REQUESTS_PER_TRIAL:
            assert f"--max-num-seqs {max_num_seqs}" in err


@pytest.mark.parametrize("name, row", [
    ("instructcoder", {"instruction": "fix \ud800 this", "input": "x = 1"}),
    ("sharegpt", {"conversations": [{"from": "human", "value": "hi \udfff"},
                                    {"from": "gpt", "value": "hello there"}]}),
    ("spec_bench", {"question_id": 1, "category": "coding", "turns": ["a \ud83d b"]}),
])
def test_built_in_workloads_refuse_lone_surrogates_in_a_dataset_file(cached_tokenizer, name,
                                                                      row) -> None:
    # json.dumps spells the lone surrogate as a \udXXX escape, as a broken export would.
    path = _file(f"{name}-surrogate.jsonl", json.dumps(row) + "\n")
    spec = WorkloadSpec(name=name, dataset_path=str(path), num_prompts=1)
    with pytest.raises(ConfigError, match="record 1: .* unpaired surrogate"):
        workloads.load(spec, tokenizer=workloads.EMBEDDED_TOKENIZER)
