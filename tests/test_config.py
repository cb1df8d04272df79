"""Settings: validation, the JSON round trip of config.json, and GenerationConfig as the one list of
decoding options (CLI flags, app controls and the /chat API are made from it)."""

import dataclasses
import inspect
import json
import re

import pytest

from chatbot.config import (ChatbotConfig, DataConfig, GenerationConfig, ModelConfig, RerankConfig, TrainConfig,
                            __version__)

DECODING_OPTIONS = [field.name for field in dataclasses.fields(GenerationConfig)]


def test_json_round_trip_keeps_every_setting():
    config = ChatbotConfig(model=ModelConfig(num_layers=2, d_model=64, vocab_size=123, shared_embeddings=True),
                           data=DataConfig(paths=("x.csv", "y.csv"), val_fraction=0.2), train=TrainConfig(epochs=3, xla=False),
                           rerank=RerankConfig(likelihood=0.25, consensus=4.0, fitted_on=500))
    assert ChatbotConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["version"] == __version__


def test_unknown_keys_are_ignored_and_missing_ones_take_defaults():
    raw = json.loads(ChatbotConfig().to_json())
    raw["model"]["from_the_future"] = 1
    del raw["train"]["epochs"]
    del raw["rerank"]  # a model trained before rerank weights were fitted: the defaults
    config = ChatbotConfig.from_json(json.dumps(raw))
    assert config.model == ModelConfig() and config.train.epochs == TrainConfig().epochs
    assert config.rerank == RerankConfig()


@pytest.mark.parametrize("make", [
    lambda: ModelConfig(d_model=30, num_heads=4), lambda: ModelConfig(num_layers=0),
    lambda: ModelConfig(dropout=1.0), lambda: DataConfig(val_fraction=1.0), lambda: TrainConfig(epochs=0),
    lambda: TrainConfig(strategy="tpu"), lambda: GenerationConfig(strategy="nucleus"),
    lambda: GenerationConfig(temperature=0.0), lambda: GenerationConfig(top_p=0.0),
    lambda: GenerationConfig(max_new_tokens=0), lambda: GenerationConfig(no_repeat_ngram_size=-1),
    lambda: RerankConfig(likelihood=-1.0), lambda: RerankConfig(consensus=float("inf")),
    lambda: RerankConfig(similarity="1"), lambda: RerankConfig(similarity=True)])
def test_bad_settings_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_generation_settings_from_loose_ui_values():
    settings = GenerationConfig.from_values({"num_beams": 3.0, "temperature": "0.5", "seed": -1})
    assert settings == GenerationConfig(num_beams=3, temperature=0.5, seed=None)
    assert isinstance(settings.num_beams, int)
    assert GenerationConfig.from_values({"seed": "7"}).seed == 7
    assert GenerationConfig.from_values({"seed": ""}).seed is None
    with pytest.raises(ValueError):
        GenerationConfig.from_values({"top_k": "many"})


def test_every_decoding_option_is_a_cli_flag_with_its_default():
    from chatbot.cli.main import build_parser

    args = build_parser().parse_args(["chat"])
    assert {name: getattr(args, name) for name in DECODING_OPTIONS} == dataclasses.asdict(GenerationConfig())
    args = build_parser().parse_args(["chat", "--no-repeat-ngram-size", "2", "--length-penalty", "0.5"])
    assert (args.no_repeat_ngram_size, args.length_penalty) == (2, 0.5)


def test_every_training_setting_with_a_help_is_a_train_flag_with_its_default():
    from chatbot.cli.main import build_parser, training_config

    required = ["train", "--data", "a.csv", "--out", "m"]
    assert training_config(build_parser().parse_args(required)) == ChatbotConfig(data=DataConfig(paths=("a.csv",)),
                                                                                 base="models/default")
    args = build_parser().parse_args([*required, "--data", "b.csv", "--d-model", "64", "--vocab-size", "500",
                                      "--no-tone", "--neighbour-questions", "--shared-embeddings", "--epochs", "3",
                                      "--no-xla", "--val-fraction", "0.2", "--seed", "7", "--strategy", "mirrored"])
    config = training_config(args)
    assert (config.model.d_model, config.model.shared_embeddings, config.tokenizer.vocab_size) == (64, True, 500)
    assert (config.context.tone, config.context.questions) == (False, True)
    assert (config.train.epochs, config.train.xla, config.train.mixed_precision, config.train.strategy) == (
        3, False, None, "mirrored")
    assert (config.data.paths, config.data.val_fraction, config.data.seed, config.train.seed) == (
        ("a.csv", "b.csv"), 0.2, 7, 7)


def test_every_decoding_option_is_an_app_control_and_a_chat_api_parameter():
    import app

    assert list(app.CONTROLS) == DECODING_OPTIONS
    api = inspect.signature(app.typed_chat_function(lambda **_: ""))
    assert list(api.parameters) == ["message", *DECODING_OPTIONS, "model", "tone", "history"]
    assert all(api.parameters[name].default == getattr(GenerationConfig(), name) for name in DECODING_OPTIONS)


def test_a_config_written_for_one_data_file_still_reads():
    legacy = ChatbotConfig().to_json().replace('"paths": []', '"path": "data/korean_chat.csv"')
    assert ChatbotConfig.from_json(legacy).data.paths == ("data/korean_chat.csv",)


# -- every bound on a decoding option lives in GenerationConfig ------------------------

NAN, INF = float("nan"), float("inf")
OUT_OF_BOUNDS = [  # (option, value) pairs that fuzzing once found accepted
    *[(name, value) for name in ("seed", "max_new_tokens", "top_k") for value in (2**31, 2**63, 10**30)],
    ("seed", -2**31 - 1), ("num_beams", 9), ("num_beams", 1000), ("num_beams", 0),
    *[(name, value) for name in ("temperature", "top_p", "repetition_penalty", "length_penalty")
      for value in (NAN, INF, -INF)],
    ("temperature", 1e-30), ("temperature", 1e30), ("repetition_penalty", 1e30), ("length_penalty", 1e6),
    ("no_repeat_ngram_size", 1), ("no_repeat_ngram_size", 2**31),
    ("top_k", "5"), ("num_beams", 2.5), ("max_new_tokens", True), ("temperature", "hot"), ("strategy", None),
    ("temperature", 10**400),
    *[(name, value) for name in ("seed", "num_beams", "max_new_tokens", "top_k", "candidates", "no_repeat_ngram_size")
      for value in (10**400, -10**400)],  # past a float's range: compared as integers, never converted
]


@pytest.mark.parametrize("name, value", OUT_OF_BOUNDS, ids=[f"{n}={v!r}"[:40] for n, v in OUT_OF_BOUNDS])
def test_decoding_options_out_of_bounds_are_value_errors(name, value):
    with pytest.raises(ValueError, match=name):
        GenerationConfig(**{name: value})


LOOSE_BUT_FINE = [("seed", -2**31 - 1), ("seed", -10**400), ("top_k", "5"), ("num_beams", 2.5), ("max_new_tokens", True)]  # -> None, 5, 2, 1


@pytest.mark.parametrize("name, value", [(n, v) for n, v in OUT_OF_BOUNDS
                                         if n != "strategy" and (n, v) not in LOOSE_BUT_FINE])
def test_loose_ui_values_out_of_bounds_are_value_errors_too(name, value):
    with pytest.raises(ValueError):
        GenerationConfig.from_values({name: value})


@pytest.mark.parametrize("changes", [
    dict(seed=2**31 - 1), dict(seed=-2**31), dict(seed=0), dict(max_new_tokens=2**31 - 1), dict(top_k=2**31 - 1),
    dict(num_beams=8), dict(no_repeat_ngram_size=2), dict(temperature=0.01), dict(repetition_penalty=50.0),
    dict(length_penalty=-1.0), dict(top_p=1e-6)])
def test_decoding_options_at_their_bounds_are_accepted(changes):
    settings = GenerationConfig(**changes)
    assert {name: getattr(settings, name) for name in changes} == changes


def test_numpy_numbers_become_plain_python_numbers():
    import numpy as np

    settings = GenerationConfig(num_beams=np.int64(3), temperature=np.float32(0.5))
    assert type(settings.num_beams) is int and type(settings.temperature) is float


def test_a_config_written_before_the_copy_head_reads_as_a_model_without_it():
    assert ChatbotConfig().model.copy_head  # new models have it
    assert not ChatbotConfig.from_json('{"model": {"num_layers": 4}}').model.copy_head
    assert ChatbotConfig.from_json(ChatbotConfig().to_json()).model.copy_head


@pytest.mark.parametrize("values, words", [
    ({"seed": "abc"}, "seed must be an integer, got 'abc'"), ({"num_beams": 4.5}, "num_beams must be an integer"),
    ({"num_beams": True}, "num_beams must be an integer, got True"), ({"temperature": True}, "temperature must be a number"),
    ({"top_k": [1]}, "top_k must be an integer"), ({"seed": 2.5}, "seed must be an integer"),
    ({"strategy": 3}, "strategy must be a string")])
def test_loose_values_that_say_something_else_are_refused_not_bent(values, words):
    """A JSON client's true, 4.5 or "abc" is a mistake to name, not a 1, a 4 or a "NoneType" complaint."""
    with pytest.raises(ValueError, match=re.escape(words)):
        GenerationConfig.from_values(values)


def test_loose_values_that_say_a_number_exactly_are_taken():
    config = GenerationConfig.from_values({"num_beams": 4.0, "top_k": "7", "temperature": "0.5", "seed": "-1"})
    assert (config.num_beams, config.top_k, config.temperature, config.seed) == (4, 7, 0.5, None)


def test_retrieval_settings_round_trip_and_a_config_written_before_them_reads_characters_only():
    import json

    from chatbot.config import CHARACTERS_ONLY, RetrievalConfig

    config = ChatbotConfig(retrieval=RetrievalConfig(threshold=0.41, fallback="가게로 전화 주세요.", fallback_share=0.1),
                           base="models/default")
    assert ChatbotConfig.from_json(config.to_json()) == config
    raw = json.loads(config.to_json())
    del raw["retrieval"], raw["base"]
    older = ChatbotConfig.from_json(json.dumps(raw))
    assert older.retrieval == CHARACTERS_ONLY and older.retrieval.threshold == 0.0 and older.base == ""
    for bad in ({"fallback": " "}, {"fallback_share": 1.0}, {"meaning": -1.0}, {"characters": 0.0, "meaning": 0.0},
                {"threshold": True}):
        with pytest.raises(ValueError):
            RetrievalConfig(**bad)
