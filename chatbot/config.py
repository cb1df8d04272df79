"""Configuration dataclasses for every stage, and their JSON round trip.

Owns: the hyperparameters and settings that describe a model directory, and the help of each that is a
CLI flag. Must not import TensorFlow, so the CLI can parse arguments and print `--help` without loading it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

__version__ = "0.1.0"
INT32_MAX = 2**31 - 1  # seeds and decoding options become int32 tensors: anything larger fails inside TensorFlow
MIN_MAX_LENGTH = 4  # start, end and at least two pieces
MAX_RETRIEVED = 8
# A model trained on dialogues reads the new message and the two before it (normally the user's previous
# message and the bot's reply to it); older messages are not read.
CONTEXT_TURNS = 2


def _flag(default, help: str, **more):  # a field the CLI makes a flag of: its help, maybe flag, metavar, choices
    return field(default=default, metadata={"help": help, **more})


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4000  # the tokenizer's, set by training (TokenizerConfig.vocab_size is the target)
    num_layers: int = _flag(4, "encoder layers, and as many decoder layers")
    d_model: int = _flag(128, "width of every token's vector (a multiple of --num-heads)")
    num_heads: int = _flag(4, "attention heads")
    dff: int = _flag(512, "feed-forward width")
    # 0, not the paper's 0.1: the model's own held-out replies scored better without it on ChatbotData
    # (BENCHMARKS.md, training levers).
    dropout: float = _flag(0.0, "share of activations dropped in training, in every layer")
    max_length: int = _flag(40, "longest question/answer in tokens")
    encoder_length: int = 0  # longest encoder input (question, tone, retrieved answers); 0: max_length
    shared_embeddings: bool = _flag(False, "the output layer is the decoder's token embedding, transposed "
                                           "(fewer weights)")
    copy_head: bool = _flag(True, "write every token from the vocabulary, without the copy head (a pointer-generator "
                                  "output that copies the retrieved answers token by token when the model decides to)")

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "dff", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.encoder_length and self.encoder_length < self.max_length:
            raise ValueError(f"encoder_length must be 0 or at least max_length, got {self.encoder_length}")
        if self.max_length < MIN_MAX_LENGTH:
            raise ValueError(f"max_length must be at least {MIN_MAX_LENGTH}, got {self.max_length}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = _flag(4000, "subword vocabulary target")  # fewer on small data; 4,000 scored above 8,000
    vocab_hash: str = ""  # sha256 of the SentencePiece model, checked on load


VAL_FRACTION = 0.1  # questions held out to choose the epoch (data of 1,000 pairs or more: `chatbot.training.sizing`)


@dataclass(frozen=True)
class DataConfig:
    paths: tuple[str, ...] = ()  # the CSV files (or dataset names) the model was trained on
    val_fraction: float | None = _flag(None, "share of questions held out to choose the epoch")  # None: see schedule
    seed: int = 42
    small_talk: str = _flag("", "Q&A CSV of greetings, thanks, goodbyes and questions about the bot that a model built "
                                "on this one keeps beside its own Q&A (found only when a message is very close to "
                                "one); default: the base model's", metavar="CSV")

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(self.paths))  # JSON gives a list
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        _check_seed(self.seed)


@dataclass(frozen=True)
class ContextConfig:
    """What the encoder reads besides the question: `[start] tone question [end]`, then `([start] message [end])
    * turns` (the conversation before it, newest first), then `(<sep> answer) * retrieved`, or with
    `questions`, `(<sep> [start] neighbour's question [end] its answer) * retrieved`."""

    retrieved: int = _flag(1, f"answers of the K nearest training questions the model reads after the question, "
                              f"nearest first (0-{MAX_RETRIEVED}; 0: the question alone)", metavar="K")
    tone: bool = _flag(True, "ignore the label column (by default it becomes a tone the model learns and `chat "
                             "--tone` asks for)")  # a help for --no-tone, as for every field True by default
    tone_dropout: float = 0.2  # share of training questions shown without their tone, so asking none works
    # Share of training questions whose own answer replaces one of their retrieved answers (Retrieve and
    # Refine), or with `questions`, one neighbour that answers alike (chatbot.training.neighbours.with_gold_biased):
    # without it the model is slow to learn that the candidates are worth reading.
    gold_rate: float = 0.5
    questions: bool = _flag(False, "show each retrieved answer with the question it answered, so the encoder can "
                                   "judge whether it fits (an option: BENCHMARKS.md has how it measured)",
                            flag="neighbour-questions")
    # Earlier messages of the conversation the encoder reads after the question, newest first (0 or
    # CONTEXT_TURNS: `train` reads them when its data has dialogues), each cut to its last max_length // 2 tokens.
    turns: int = 0
    index_hash: str = ""  # sha256 of retrieval.json, checked on load

    def __post_init__(self):
        if not 0 <= self.turns <= CONTEXT_TURNS:
            raise ValueError(f"turns must be between 0 and {CONTEXT_TURNS}, got {self.turns}")
        if not 0 <= self.retrieved <= MAX_RETRIEVED:
            raise ValueError(f"retrieved must be between 0 and {MAX_RETRIEVED}, got {self.retrieved}")
        for name in ("tone_dropout", "gold_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


TONES = ("everyday", "sad", "love")  # the label column's 0, 1 and 2
NO_CONTEXT = ContextConfig(retrieved=0, tone=False)  # what models saved before ContextConfig read


@dataclass(frozen=True)
class RerankConfig:
    """The weights `chatbot.decoding.rerank.choose` gives a candidate reply's mean log-probability under the model,
    its question's retrieval score and its overlap with the other retrieved answers. `train` fits them on
    its validation questions (`fitted_on` of them; 0: these defaults, the weights fitted for the 20-minute
    model of `bench/quality.py`)."""

    likelihood: float = 0.25
    similarity: float = 16.0
    consensus: float = 4.0
    fitted_on: int = 0

    def __post_init__(self):
        for name in ("likelihood", "similarity", "consensus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < math.inf:
                raise ValueError(f"rerank {name} must be a weight of at least 0, got {value!r}")


FALLBACK_REPLY = "잘 모르는 내용이에요. 다른 말로 다시 물어봐 주시겠어요?"


MAX_FALLBACK_CHARS = 200  # the fallback reply is a reply: a decoded one is at most max_length tokens, about as long


@dataclass(frozen=True)
class RetrievalConfig:
    """How the retrieval index scores each training question for a message, and when nothing fits.

    The score is a weighted mean of cosine similarities: `characters` (TF-IDF over the characters and
    character bigrams of the training question), `answers` (the same over one document per distinct answer:
    the answer with every question it was given to), `meaning` (the sentence encoder's embeddings of the
    two texts, `chatbot.model.sentence`) and `pretrained` (multilingual-e5-small, `chatbot.model.pretrained`: the message
    against each distinct answer's document; 0 loads no pretrained encoder; `pretrained_encoder` names the
    weights it was embedded with, `pretrained.encoder_identity`). A message with the conversation before it is
    scored as one text, weighted `conversation`, and as the new message alone, weighted the rest (a first
    message: alike); with `message_wins` a training question keeps the better of that score and the message's
    alone, so a change of topic mid-conversation finds the neighbours of its own words. A message whose best
    score is below `threshold` gets `fallback` instead of a reply; `train` calibrates the threshold on held-out
    questions. Small talk kept from the model a model was built on (`retrieval.Retriever`) is found only at
    `small_talk_threshold` or above. The default weights are the ones bench/retrieval.py chose for everyday chat; a model built on another for its own Q&A uses `FOR_OWN_DATA`;
    models saved before this section read `CHARACTERS_ONLY`."""

    characters: float = _flag(0.5, "retrieval's weight on the characters a message shares with a training question "
                                   "(with --from-scratch)", metavar="WEIGHT")
    answers: float = _flag(0.0, "retrieval's weight on the characters it shares with an answer's document (with "
                                "--from-scratch)", metavar="WEIGHT")
    meaning: float = _flag(1.0, "retrieval's weight on the cosine of the model's own sentence encoder, trained first "
                                "(with --from-scratch)", metavar="WEIGHT")
    pretrained: float = _flag(0.0, "retrieval's weight on multilingual-e5-small's cosine to an answer's document (with "
                                   "--from-scratch; a model built on a base uses it alone)", metavar="WEIGHT")
    threshold: float = 0.0
    small_talk_threshold: float = 0.0
    pretrained_encoder: str = ""
    conversation: float = 1.0
    message_wins: bool = True
    fallback: str = _flag(FALLBACK_REPLY, "what the model says when no training question is close enough in "
                                          "meaning (e.g. your phone number)", metavar="TEXT")
    fallback_share: float = _flag(0.05, "share of in-scope questions (held out, or new wordings of a training "
                                        "question) allowed to get the fallback: sets the threshold; 0: never",
                                  metavar="SHARE")

    def __post_init__(self):
        for name in ("characters", "answers", "meaning", "pretrained", "threshold", "small_talk_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < math.inf:
                raise ValueError(f"retrieval {name} must be a number of at least 0, got {value!r}")
        if isinstance(self.conversation, bool) or not isinstance(self.conversation, numbers.Real) \
                or not 0.0 <= self.conversation <= 1.0:
            raise ValueError(f"retrieval conversation must be in [0, 1], got {self.conversation!r}")
        if not isinstance(self.message_wins, bool):
            raise ValueError(f"retrieval message_wins must be true or false, got {self.message_wins!r}")
        if not self.total:
            raise ValueError("retrieval needs a positive weight for characters, answers, meaning or pretrained")
        if not isinstance(self.pretrained_encoder, str):
            raise ValueError(f"retrieval pretrained_encoder must be a string, got {self.pretrained_encoder!r}")
        if not isinstance(self.fallback, str) or not any(unicodedata.category(c)[0] not in "CZ" for c in self.fallback):
            raise ValueError("the fallback reply must hold a visible character (not only spaces, control or "
                             "zero-width characters)")
        if len(self.fallback) > MAX_FALLBACK_CHARS:
            raise ValueError(f"the fallback reply is too long ({len(self.fallback):,} characters; a reply has at most "
                             f"{MAX_FALLBACK_CHARS})")
        if isinstance(self.fallback_share, bool) or not isinstance(self.fallback_share, numbers.Real) \
                or not 0.0 <= self.fallback_share < 1.0:
            raise ValueError(f"fallback_share must be in [0, 1), got {self.fallback_share!r}")

    @property
    def total(self) -> float:
        return self.characters + self.answers + self.meaning + self.pretrained


RETRIEVAL_WEIGHTS = ("characters", "answers", "meaning", "pretrained")  # chosen with --from-scratch only
CHARACTERS_ONLY = RetrievalConfig(characters=1.0, answers=0.0, meaning=0.0)  # and never the fallback
# A FAQ's paraphrases are new wordings of its questions, far from the everyday chat the own sentence encoder learned
# from: multilingual-e5-small over one document per distinct answer finds more of them than characters, answer
# documents or the sentence encoder, alone or fused (bench/retrieval.py, bench/faq_levers.py).
FOR_OWN_DATA = {"characters": 0.0, "answers": 0.0, "meaning": 0.0, "pretrained": 1.0}


SELECTIONS = ("chrf", "loss", "last")
DISTRIBUTIONS = ("auto", "mirrored", "multi-worker")


@dataclass(frozen=True)
class TrainConfig:
    # None: chosen from the data's size by chatbot.training.sizing.fitted_to_data (explicit values are kept).
    epochs: int | None = _flag(None, "passes over the data")
    batch_size: int | None = _flag(None, "pairs per step")
    warmup_steps: int | None = _flag(None, "steps of rising learning rate")
    repeats: int | None = _flag(None, "each pair this many times an epoch")
    # None: d_model^-0.5 * warmup_steps^-0.5, the paper's peak. A 1e-3 peak after 1,000 steps was tried
    # as the default and answered nearly every question alike after 13-18 epochs (BENCHMARKS.md).
    peak_learning_rate: float | None = _flag(None, "where the warmup schedule peaks (unset: the paper's "
                                                   "d_model^-0.5 * warmup^-0.5)", metavar="LR")
    label_smoothing: float = _flag(0.0, "share of each target's probability spread over the whole vocabulary (0: off)")
    early_stopping: int | None = _flag(None, "stop after this many epochs without improvement of the --select "
                                             "metric (0: off)", metavar="PATIENCE")
    mixed_precision: bool | None = _flag(None, "train in float32 even on a GPU")  # None: on when a GPU is present
    xla: bool | None = _flag(None, "do not compile with XLA")  # None: on when a GPU is present
    strategy: str = _flag("auto", "tf.distribute: mirrored = all local GPUs; multi-worker = machines in TF_CONFIG",
                          choices=DISTRIBUTIONS)
    seed: int = 42
    select: str = _flag("chrf", "which epoch to keep: chrf = best replies to the validation questions (chrF), "
                                "loss = lowest validation loss, last = the last one", choices=SELECTIONS)

    def __post_init__(self):
        if self.select not in SELECTIONS:
            raise ValueError(f"select must be one of {', '.join(SELECTIONS)}, got {self.select!r}")
        for name, lowest in (("epochs", 1), ("batch_size", 1), ("warmup_steps", 1), ("repeats", 1),
                             ("early_stopping", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < lowest):
                wanted = "a positive integer" if lowest else "0 (off) or a positive integer"
                raise ValueError(f"{name} must be {wanted}, got {_short(value)}")
        if self.peak_learning_rate is not None and not 0.0 < self.peak_learning_rate < 1.0:
            raise ValueError(f"peak_learning_rate must be in (0, 1), got {self.peak_learning_rate}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.strategy not in DISTRIBUTIONS:
            raise ValueError(f"unknown strategy {self.strategy!r}")
        _check_seed(self.seed)


def _short(value) -> str:
    """A value for an error line: a 400-digit integer is named by its size, not printed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:12]}... ({len(text)} characters)"


def _check_seed(seed) -> None:
    """A training seed seeds Python, NumPy (0..2**32-1) and TensorFlow (int32): it must fit them all."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= INT32_MAX:
        raise ValueError(f"seed must be an integer between 0 and {INT32_MAX}, got {_short(seed)}")


STRATEGIES = ("greedy", "beam", "sample")  # chatbot.decoding.samplers has a sampler for each
MAX_BEAMS = 8  # each beam width compiles (and keeps) its own decoding function
MAX_CANDIDATES = 16  # retrieved answers weighed against the generated reply; each count compiles its own loop
class Compilation(str, enum.Enum):
    """How a plan's loop runs. Each new batch or encoder-length shape costs an XLA compilation of seconds on a CPU,
    a graph trace about as much once per plan, and eager decoding nothing up front but slower steps."""

    EAGER = "eager"  # op by op, untraced: a process that answers one question
    GRAPH = "graph"  # traced plain graphs: tests, scripts and a conversation in the terminal
    XLA = "xla"  # XLA-compiled loops, each shape compiled when first met
    WARMED = "warmed"  # XLA for the plans `warm_up` compiled, plain graphs for the rest: no request waits (the app)


class SettingsError(ValueError):
    """A decoding option or tone a model refuses (the app says so apart from a refused question)."""


MAX_QUESTION_CHARS = 1000  # longer questions are refused: the model reads max_length tokens anyway
# (lowest, highest) for every decoding option that is a number; a float must also be finite.
GENERATION_BOUNDS = {
    "max_new_tokens": (1, INT32_MAX),  # capped by the model's max_length when decoding
    "num_beams": (1, MAX_BEAMS),
    "length_penalty": (-10.0, 10.0),
    "agreement": (0.0, 100.0),
    "mbr": (0.0, 100.0),
    "candidates": (0, MAX_CANDIDATES),
    "temperature": (0.01, 100.0),
    "top_k": (0, INT32_MAX),
    "top_p": (0.0, 1.0),  # and above 0: checked on its own
    "repetition_penalty": (0.01, 100.0),
    "no_repeat_ngram_size": (0, INT32_MAX),  # 0 or 2..the model's max_length (`Chatbot` checks the top)
    "seed": (-INT32_MAX - 1, INT32_MAX),
}


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options, named as in other generation APIs. These fields are the one list of them:
    the CLI's flags, the app's controls and its `/chat` API are made from them (`help` is the CLI's)."""

    strategy: str = _flag("greedy", "how each next token is chosen", choices=STRATEGIES)
    max_new_tokens: int = _flag(40, "longest reply in tokens (capped by max_length)")
    num_beams: int = _flag(4, "beam width for --strategy beam")
    length_penalty: float = _flag(1.0, "beam scores are divided by length**this (higher favours longer replies)")
    agreement: float = _flag(0.0, "beam search: add this times the reply's word overlap (token F1) with the retrieved "
                                  "answers to its score (0: off; needs a model that reads retrieved answers)")
    mbr: float = _flag(0.0, "beam search: add this times the reply's mean word overlap (token F1) with the other beams "
                            "to its score, so a reply the beams agree on wins (minimum Bayes risk decoding; 0: off)")
    candidates: int = _flag(0, "weigh the answers of this many nearest training questions against the decoded reply "
                               "and answer with the one the model and they agree on most (0: the reply as decoded)")
    temperature: float = _flag(1.0, "for --strategy sample; higher is more random")
    top_k: int = _flag(0, "sample among the k likeliest tokens (0: all)")
    top_p: float = _flag(1.0, "nucleus sampling mass (1.0: off)")
    repetition_penalty: float = _flag(1.0, "1.0: off")
    no_repeat_ngram_size: int = _flag(0, "never repeat an n-gram of this size (0: off)")
    seed: int | None = _flag(None, "makes sampling reproducible")

    def __post_init__(self):
        """Every bound on a decoding option, checked here and nowhere else, before any model work:
        the CLI, the Python API and the app all build this. Raises ValueError (never TypeError)."""
        if not isinstance(self.strategy, str) or self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be {', '.join(STRATEGIES)}, got {self.strategy!r}")
        for name, (lowest, highest) in GENERATION_BOUNDS.items():
            value = getattr(self, name)
            if name == "seed" and value is None:
                continue
            integer = isinstance(highest, int)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            given = value
            try:
                value = int(value) if integer else float(value)
            except OverflowError:  # float(10**400)
                value = math.nan
            # Integers are compared as integers: math.isfinite(10**400) itself raises OverflowError.
            if not ((integer or math.isfinite(value)) and lowest <= value <= highest):
                raise ValueError(f"{name} must be between {lowest} and {highest}, got {_short(given)}")
            object.__setattr__(self, name, value)  # plain int/float, whatever numeric type came in
        if self.top_p <= 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.no_repeat_ngram_size == 1:
            raise ValueError("no_repeat_ngram_size must be 0 (off) or at least 2")

    @classmethod
    def from_values(cls, values: dict) -> "GenerationConfig":
        """From loosely typed values, as UI widgets and JSON clients send them (4.0 or "4" for 4; a seed of "",
        None or -1 for none); a missing option takes its default. Raises ValueError for values that do not
        fit: true for a number, 4.5 for an integer, "abc" for a seed."""
        options = {}
        for option in dataclasses.fields(cls):
            value = values.get(option.name, option.default)
            if option.name == "seed":
                seed = None if value is None or value == "" else _loose(option.name, value, int)
                options["seed"] = None if seed is None or seed < 0 else seed
            else:
                options[option.name] = _loose(option.name, value, type(option.default))
        return cls(**options)


def _loose(name: str, value, kind: type):
    """`value` as `kind` (str, int or float) when it says exactly that: 4.0 and "4" are the integer 4, but
    4.5, true, "abc" and [1] are refused with a ValueError naming the option."""
    wanted = {str: "a string", int: "an integer", float: "a number"}[kind]
    if kind is str and isinstance(value, str):
        return value
    try:
        if isinstance(value, bool) or kind is str or not isinstance(value, (numbers.Real, str)):
            raise ValueError
        if kind is int and isinstance(value, numbers.Integral):
            return int(value)  # exact, however large: the bounds check names it
        number = float(value)  # "4", 4, 4.0, 10**400 (OverflowError), "abc" (ValueError)
        if kind is float:
            return number
        if not number.is_integer():  # 4.5, inf, nan
            raise ValueError
        return int(number)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {wanted}, got {_short(value)}") from None


@dataclass(frozen=True)
class ChatbotConfig:
    """Everything `config.json` in a model directory records."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    base: str = ""  # the model directory this one was built on ("": trained from scratch)
    version: str = __version__

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ChatbotConfig":
        raw = json.loads(text)
        data = raw.get("data", {})
        if "path" in data and "paths" not in data:  # written before training on several files
            data["paths"] = [data["path"]] if data["path"] else []
        raw.setdefault("model", {}).setdefault("copy_head", False)  # written before the copy head existed

        def section(section_cls, name):
            known = {f.name for f in dataclasses.fields(section_cls)}
            return section_cls(**{k: v for k, v in raw.get(name, {}).items() if k in known})

        context = section(ContextConfig, "context") if "context" in raw else NO_CONTEXT
        retrieval = section(RetrievalConfig, "retrieval") if "retrieval" in raw else CHARACTERS_ONLY
        return cls(model=section(ModelConfig, "model"), tokenizer=section(TokenizerConfig, "tokenizer"),
                   context=context, data=section(DataConfig, "data"), train=section(TrainConfig, "train"),
                   rerank=section(RerankConfig, "rerank"), retrieval=retrieval,
                   base=raw.get("base", ""), version=raw.get("version", ""))

    @classmethod
    def read(cls, path: str | Path) -> "ChatbotConfig":
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
