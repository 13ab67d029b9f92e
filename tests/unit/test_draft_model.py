"""A drafter for the draft space (and for `tuner bench`'s speculative config): the embedded
default's made drafter where the space names it (`model: embedded-draft`), a user's own with
--draft-model PATH, checked before any launch (a folder with config.json, the target's
tokenizer), bad input one message and exit 2.
Building the made drafter: tests/integration/test_embedded_draft.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tuner import api, checks, cli
from tuner.api import drafters
from tuner.errors import ConfigError
from tuner.measure import model as embedded
from tuner.measure import workloads
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.search import space as spaces

TOK = str(workloads.EMBEDDED_TOKENIZER)


def _drafter(tmp_path: Path, *, tokenizer: str = "same", vocab_size: int = 49152) -> Path:
    """A drafter folder: config.json, and the target's tokenizer ("same"), another one
    ("other") or none ("none", as an EAGLE head)."""
    folder = tmp_path / f"drafter-{tokenizer}-{vocab_size}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama",
                                                    "vocab_size": vocab_size}))
    if tokenizer == "same":
        for f in embedded.embedded_tokenizer_dir().iterdir():
            shutil.copy(f, folder / f.name)
    elif tokenizer == "other":
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = ["[UNK]", "def", "area", "return", "r", "(", ")", ":", "*", "#"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def _embedded_engine(tmp_path: Path) -> EngineSpec:
    model = tmp_path / "target"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 49152}))
    for f in embedded.embedded_tokenizer_dir().iterdir():
        shutil.copy(f, model / f.name)
    return EngineSpec(model=str(model), model_name=embedded.EMBEDDED_HUB_ID)


def test_the_draft_space_takes_the_made_drafter_on_the_embedded_default(monkeypatch, tmp_path):
    made = tmp_path / "made"
    monkeypatch.setattr(embedded, "embedded_draft_dir", lambda: made)
    sp = drafters.drafted_space(spaces.load("draft"), _embedded_engine(tmp_path), None)
    assert sp.methods["draft_model"]["model"] == str(made)
    assert spaces.load("draft").methods["draft_model"]["model"] == checks.EMBEDDED_DRAFT


def test_the_made_drafter_is_refused_for_another_target(monkeypatch, tmp_path):
    monkeypatch.setattr(embedded, "embedded_draft_dir", lambda: pytest.fail("built"))
    engine = EngineSpec(model=TOK, model_name="meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="Llama-3.1-8B.*Pass --draft-model PATH"):
        drafters.drafted_space(spaces.load("draft"), engine, None)


def test_draft_model_replaces_the_spaces_drafter_when_it_shares_the_tokenizer(tmp_path):
    folder = str(_drafter(tmp_path))
    sp = drafters.drafted_space(spaces.load("draft"), _embedded_engine(tmp_path), folder)
    assert sp.methods["draft_model"]["model"] == folder
    cfg = sp.config_from_params(spaces.Point.from_params(
        {"method": "draft_model", "draft_model.num_speculative_tokens": 2}))
    assert cfg.speculative_config["model"] == folder
    # A head without a tokenizer (EAGLE) is compared by its vocabulary's size.
    head = str(_drafter(tmp_path, tokenizer="none"))
    eagle = spaces.parse({"methods": {"eagle": {"model": "/x", "num_speculative_tokens": 2}}})
    assert drafters.drafted_space(eagle, _embedded_engine(tmp_path), head
                                  ).methods["eagle"]["model"] == head


@pytest.mark.parametrize("tokenizer, vocab_size, fragment", [
    ("other", 49152, "its tokenizer has 10 tokens, the target"),
    ("none", 32000, "vocab_size 32000, the target"),
])
def test_a_drafter_with_other_tokens_is_refused(tmp_path, tokenizer, vocab_size, fragment):
    folder = str(_drafter(tmp_path, tokenizer=tokenizer, vocab_size=vocab_size))
    with pytest.raises(ConfigError, match=fragment):
        drafters.drafted_space(spaces.load("draft"), _embedded_engine(tmp_path), folder)


def test_the_same_size_split_differently_is_refused():
    ids = tuple(range(12))
    ours = checks.Vocabulary(vocab_size=100, tokens=100, probe_ids=ids)
    other = checks.Vocabulary(vocab_size=100, tokens=100, probe_ids=ids[:5] + (99,) + ids[6:])
    with pytest.raises(ConfigError, match=r"token 5: ids \[5, 6, 7\] against \[99, 6, 7\]"):
        checks.draft_vocabulary("/d", ours, other, target_name="t")
    checks.draft_vocabulary("/d", ours, ours, target_name="t")  # the same: passes
    # A padded embedding beside the same tokenizer is no mismatch (Qwen2.5's 0.5B and 7B).
    checks.draft_vocabulary("/d", ours, ours.__class__(vocab_size=128, tokens=100,
                                                       probe_ids=ids), target_name="t")


def test_vocabulary_reads_the_tokenizer_and_the_config(tmp_path):
    v = workloads.vocabulary(str(_drafter(tmp_path)), what="drafter")
    assert (v.vocab_size, v.tokens) == (49152, 49152) and v.probe_ids and len(v.probe_ids) > 10
    assert workloads.vocabulary(str(_drafter(tmp_path, tokenizer="none")), what="drafter"
                                ) == checks.Vocabulary(vocab_size=49152)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "f").write_text("x") and p / "f", "is a file"),
    (lambda p: p, "no readable config.json in it (missing)"),
    (lambda p: (p / "config.json").write_text("{") and p, "no readable config.json in it"),
    (lambda p: (p / "config.json").write_text("[1]") and p, "is not a JSON object"),
])
def test_draft_model_folder_refuses_what_is_no_checkpoint(tmp_path, make, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        checks.draft_model_folder(str(make(tmp_path)))
    ok = _drafter(tmp_path)
    assert checks.draft_model_folder(str(ok)) == str(ok.resolve())


@pytest.mark.parametrize("argv, fragment", [
    (["--space", "draft", "--draft-model", "{missing}"], "does not exist"),
    (["--space", "draft", "--draft-model", "{other}"], "not the same tokenizer"),
    (["--space", "ngram", "--draft-model", "{same}"], "has no method that loads a drafter"),
    (["--space", "draft"], "the drafter made for the embedded default model"),
])
def test_bad_draft_model_is_one_message_and_exit_2(capsys, tmp_path, argv, fragment):
    paths = {"{missing}": str(tmp_path / "missing"),
             "{other}": str(_drafter(tmp_path, tokenizer="other")),
             "{same}": str(_drafter(tmp_path))}
    out = tmp_path / "deep" / "out"
    argv = [paths.get(a, a) for a in argv]
    assert cli.main(["optimize", "--model", TOK, "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and fragment in err, err
    assert not (tmp_path / "deep").exists()


def test_draft_model_reaches_the_options(monkeypatch, tmp_path):
    seen = []

    def fake(options, **_kwargs):
        seen.append(options)
        raise ConfigError("stop")

    monkeypatch.setattr(api, "optimize_and_report", fake)
    folder = _drafter(tmp_path)
    assert cli.main(["-q", "optimize", "--space", "draft", "--draft-model", str(folder)]) == 2
    assert seen[0].draft_model == str(folder.resolve())


def _bench_config(**spec) -> TrialConfig:
    return TrialConfig(speculative_config={"method": "draft_model",
                                           "num_speculative_tokens": 3, **spec})


def test_bench_takes_its_drafter_from_draft_model(tmp_path):
    folder = str(_drafter(tmp_path))
    engine = _embedded_engine(tmp_path)
    got = drafters.drafted_config(_bench_config(), engine, folder)
    assert got.speculative_config == {"method": "draft_model", "num_speculative_tokens": 3,
                                      "model": folder}
    # The same drafter named twice is one drafter; the embedded name gives way to the flag.
    for named in (folder, checks.EMBEDDED_DRAFT):
        assert drafters.drafted_config(_bench_config(model=named), engine, folder) == got
    assert drafters.drafted_config(_bench_config(model="/x"), engine, None
                                   ) == _bench_config(model="/x")  # no flag: as given


def test_bench_resolves_the_made_drafter_as_the_space_does(monkeypatch, tmp_path):
    made = tmp_path / "made"
    monkeypatch.setattr(embedded, "embedded_draft_dir", lambda: made)
    got = drafters.drafted_config(_bench_config(model=checks.EMBEDDED_DRAFT),
                                  _embedded_engine(tmp_path), None)
    assert got.speculative_config["model"] == str(made)
    other = EngineSpec(model="/models/Llama-3.1-8B", model_name="meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="config's \"model\" is embedded-draft.*Llama-3.1-8B"):
        drafters.drafted_config(_bench_config(model=checks.EMBEDDED_DRAFT), other, None)


@pytest.mark.parametrize("argv, fragment", [
    (["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}',
      "--draft-model", "{same}"], "method ngram, which loads no drafter"),
    (["--draft-model", "{same}"], "no speculative config (the baseline)"),
    (["--speculative-config", '{"method":"draft_model","model":"/x",'
      '"num_speculative_tokens":3}', "--draft-model", "{same}"], "name two drafters"),
    (["--speculative-config", '{"method":"draft_model","num_speculative_tokens":3}',
      "--draft-model", "{other}"], "not the same tokenizer"),
    (["--speculative-config", '{"method":"draft_model","num_speculative_tokens":3}',
      "--draft-model", "{missing}"], "does not exist"),
])
def test_bench_draft_model_mistakes_are_one_message_and_exit_2(capsys, tmp_path, argv,
                                                                fragment):
    paths = {"{missing}": str(tmp_path / "missing"),
             "{other}": str(_drafter(tmp_path, tokenizer="other")),
             "{same}": str(_drafter(tmp_path))}
    out = tmp_path / "deep" / "out"
    argv = [paths.get(a, a) for a in argv]
    assert cli.main(["bench", "--model", TOK, "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and fragment in err, err
    assert not (tmp_path / "deep").exists()


def test_bench_draft_model_reaches_the_options(monkeypatch, tmp_path):
    seen = []

    def fake(options, **_kwargs):
        seen.append(options)
        raise ConfigError("stop")

    monkeypatch.setattr(api, "bench", fake)
    folder = _drafter(tmp_path)
    assert cli.main(["-q", "bench", "--speculative-config",
                     '{"method":"draft_model","num_speculative_tokens":3}',
                     "--draft-model", str(folder)]) == 2
    assert seen[0].draft_model == str(folder.resolve())
