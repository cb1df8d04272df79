"""Shared fixtures: small real Korean data and a tiny model trained once per session.

Markers: `slow` marks browser, notebook, subprocess, compile-latency (XLA, start-up and background tracing)
and training tests; `pytest -m "not slow"` is the quick lane, plain `pytest` runs everything.
"""

import csv
import fcntl
import os
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Property tests run as many examples as the profile says: "quick" in every run, "thorough" when asked for
# (HYPOTHESIS_PROFILE=thorough pytest tests/test_properties.py; CHATBOT_PROPERTY_EXAMPLES sets its size).
settings.register_profile("quick", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", settings.get_profile("quick"),
                          max_examples=int(os.environ.get("CHATBOT_PROPERTY_EXAMPLES", 2000)))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Each pytest-xdist worker (and the subprocesses and notebook kernel it starts) gets its share of the
    # cores instead of thread pools as wide as the machine: TensorFlow's pools spin while they wait, and
    # with every worker's pools on the same cores the suite spent 9% more CPU time and 12% more wall time.
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", _threads)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", _threads)

ROOT = Path(__file__).resolve().parent.parent
SHARED_CHATBOT_DATA = ROOT.parent / "shared" / "data" / "ChatbotData.csv"

# Thirty short pairs written for the tests: every answer is distinct, so an overfit model
# must really tell the questions apart.
TINY_PAIRS = [
    ("안녕하세요", "반가워요.", 0), ("배고파", "맛있는 거 드세요.", 0), ("너무 피곤해", "푹 쉬세요.", 0),
    ("오늘 날씨 어때?", "맑고 따뜻해요.", 0), ("비 온다", "우산 챙기세요.", 0), ("심심해 ㅋㅋ", "산책 어때요?", 0),
    ("잠이 안 와", "따뜻한 우유 마셔봐요.", 0), ("시험 망쳤어 ㅠㅠ", "다음엔 잘할 거예요.", 1),
    ("헤어졌어", "많이 힘들겠어요.", 1), ("외로워", "제가 곁에 있을게요.", 1), ("우울해", "천천히 이야기해 줘요.", 1),
    ("회사 가기 싫다", "오늘만 버텨봐요.", 0), ("주말에 뭐 하지", "여행 가보세요.", 0), ("운동해야 하는데", "가볍게 걸어봐요.", 0),
    ("좋아하는 사람 생겼어", "설레는 일이네요!", 2), ("고백할까?", "용기 내 보세요.", 2), ("사랑해", "저도 좋아해요.", 2),
    ("데이트 어디로 가지", "공원 산책 좋아요.", 2), ("기분 최고야", "저도 기뻐요!", 2), ("생일 축하해줘", "생일 축하해요!", 2),
    ("돈이 없어", "아껴 쓰면 괜찮아요.", 0), ("고양이 키우고 싶어", "귀여운 친구가 생기겠네요.", 0),
    ("친구랑 싸웠어", "먼저 연락해 봐요.", 1), ("엄마 보고 싶다", "전화 한 통 드려요.", 1),
    ("이사 가야 해", "새 집이 기대되네요.", 0), ("커피 마실까", "한 잔 정도는 좋아요.", 0),
    ("머리 아파", "약 먹고 쉬세요.", 1), ("취업 했어!", "정말 축하해요!", 2), ("눈 온다", "따뜻하게 입으세요.", 0),
    ("잘 자", "좋은 꿈 꾸세요.", 0),
]

# Three short dialogues whose follow-up is the same "응": only the conversation before it tells the replies apart.
TINY_DIALOGUES = [
    ("d1", "user", "소나기 온다"), ("d1", "bot", "우산 있어요?"), ("d1", "user", "응"), ("d1", "bot", "다행이에요, 젖지 마세요."),
    ("d2", "user", "출출해"), ("d2", "bot", "라면 끓일까요?"), ("d2", "user", "응"), ("d2", "bot", "물 먼저 올려요."),
    ("d3", "user", "할 게 없네"), ("d3", "bot", "영화 볼래요?"), ("d3", "user", "응"), ("d3", "bot", "팝콘도 챙겨요."),
]


def history_of(dialogue: str) -> list[dict]:
    """The first exchange of one of TINY_DIALOGUES, as a history (Gradio's chat format)."""
    first, reply = [text for name, _, text in TINY_DIALOGUES if name == dialogue][:2]
    return [{"role": "user", "content": first}, {"role": "assistant", "content": reply}]


def follow_up_answer(dialogue: str) -> str:
    """What the bot answers "응" with, after `history_of(dialogue)`."""
    return [text for name, _, text in TINY_DIALOGUES if name == dialogue][3]


# pytest-xdist (`--dist loadfile`, `--no-loadscope-reorder`) hands whole files to its workers in this order
# and the rest by name: the longest files first (their seconds on 2 cores in a comment), so that no worker is
# left running one of them alone at the end. The notebook (it trains its own model), test_model.py and the
# short files after test_engine.py need no session model: while one worker trains the session's tiny model
# (test_engine.py's first test asks for it), the other has work instead of waiting for it.
LONGEST_FIRST = [
    "test_notebook.py",  # 56
    "test_model.py",  # 8
    "test_engine.py",  # 94
    "test_sentence.py",  # 3
    "test_pipeline.py",  # 4
    "test_datasets.py",  # 3
    "test_cli.py",  # 69
    "test_app.py",  # 54
    "test_bench.py",  # 56
    "test_train.py",  # 51
    "test_runstate.py",  # 36
    "test_tutorial_notebook.py",  # 30
    "test_selection.py",  # 31
    "test_rerank.py",  # 21
    "test_export.py",  # 20
    "test_cluster.py",  # 20
    "test_backends.py",  # 19
    "test_browser.py",  # 16
    "test_properties.py",  # 14
    "test_default_model.py",  # 14
    "test_serving.py",  # 9
    "test_workspace.py",  # 9
    "test_retrieval.py",  # 9
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


REPEATS = 40  # each pair forty times an epoch: few epochs, so little per-epoch overhead (callbacks, checkpoints)


def write_csv(path: Path, rows, header=("Q", "A", "label"), encoding="utf-8") -> Path:
    with open(path, "w", newline="", encoding=encoding) as file:
        writer = csv.writer(file)
        if header:
            writer.writerow(header)
        writer.writerows(rows)
    return path


def stages_run(bot) -> list[str]:
    """From now on, the name of each of `bot`'s decoding stages (`prepare`, `loop`, `start`, `step`) each time it
    runs as Python. A bot that is not eager runs them as Python only while it traces a graph, so the list stays
    empty across replies that traced nothing (and names what a trace built)."""
    ran = []
    generator, loop = bot.generator, bot.generator.loop
    for name, owner, attribute in (("prepare", generator, "prepare"), ("loop", loop, "run"), ("start", loop, "start"),
                                   ("step", loop, "step")):
        stage = getattr(owner, attribute)

        def recorded(*args, _name=name, _stage=stage, **kwargs):
            ran.append(_name)
            return _stage(*args, **kwargs)

        setattr(owner, attribute, recorded)  # on this bot only: its graphs look the stage up when they trace
    return ran


def saved_model_class(model_dir: Path) -> str:
    """The class a model directory's model.keras holds, as Keras recorded it ("module.ClassName")."""
    import json
    import zipfile

    with zipfile.ZipFile(model_dir / "model.keras") as archive:
        saved = json.loads(archive.read("config.json"))
    return f"{saved['module']}.{saved['class_name']}"


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("data") / "tiny.csv", TINY_PAIRS)


def tiny_config(epochs=4, **train):
    from chatbot.config import ChatbotConfig, DataConfig, ModelConfig, TokenizerConfig, TrainConfig

    return ChatbotConfig(
        model=ModelConfig(num_layers=1, d_model=32, num_heads=2, dff=64, dropout=0.0, max_length=16),
        tokenizer=TokenizerConfig(vocab_size=200),
        data=DataConfig(val_fraction=0.0),
        train=TrainConfig(epochs=epochs, batch_size=16, warmup_steps=100, peak_learning_rate=None, **train))


@pytest.fixture(scope="session")
def tiny_dialogues_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("data") / "dialogues.csv", TINY_DIALOGUES,
                     header=("dialogue", "speaker", "text"))


def made_once(tmp_path_factory, folder: str, name: str, made: str, make) -> Path:
    """`folder/name` in the folder that every pytest-xdist worker's temporary folder sits in, made by `make(path)`
    (which writes it whole or not at all, `made` its last file) by the first worker to ask; the others wait."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder that holds every worker's own temporary folder
    out = shared / folder / name
    out.parent.mkdir(exist_ok=True)
    with open(shared / f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / made).is_file():
            make(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_csv, tiny_dialogues_csv) -> Path:
    """A model overfit on TINY_PAIRS and TINY_DIALOGUES (so it reads the conversation before a message, as the
    default model does), trained once per test run: 540 steps, after which it gives every answer exactly (it
    also reads the retrieved answer; at 300 steps 7 of 30 replies were off). Alone in its folder: tests use
    that folder as a model shelf. pytest-xdist's workers share it: the first to get here trains it."""
    from chatbot.data.pairs import load_pairs
    from chatbot.training.train import train

    def make(out):
        pairs = load_pairs(tiny_csv)[0] + load_pairs(tiny_dialogues_csv)[0]
        # "last": an overfit model's last epoch is its best, so no checkpoint of each better epoch is written
        train(pairs * REPEATS, tiny_config(epochs=6, select="last"), out, verbose=0, log=lambda *_: None)

    return made_once(tmp_path_factory, "tiny_models", "tiny", "model.keras", make)


@pytest.fixture(scope="session")
def tiny_saved_model(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model exported as a SavedModel (`chatbot.serving.saved_model`), once per test run and shared by the workers as
    `tiny_model_dir` is: an export traces every signature, seconds each. Tests read it, or copy it first."""
    from chatbot.serving.saved_model import export_saved_model

    return made_once(tmp_path_factory, "tiny_export", "saved", "saved_model.pb",
                     lambda out: export_saved_model(tiny_model_dir, out))


@pytest.fixture(scope="session")
def tiny_bot(tiny_model_dir):
    """The tiny model's `Chatbot`, decoding as a plain graph: with XLA every new batch and encoder-length
    shape costs seconds of compilation on a CPU, again and again across the suite. The XLA loop gives the
    same tokens (test_engine.py checks it), and the tests of XLA itself, warm-up and the SavedModel use it."""
    from chatbot.decoding.chatbot import Chatbot

    return Chatbot.load(tiny_model_dir, compilation="graph")


@pytest.fixture(scope="session")
def shared_chatbot_data() -> Path:
    """The public ChatbotData.csv beside the checkout (`../shared`), for checks that need it."""
    if not SHARED_CHATBOT_DATA.is_file():
        pytest.skip("../shared/data/ChatbotData.csv is not present")
    return SHARED_CHATBOT_DATA


def unused_port() -> int:
    """A port nothing listens on now. Another process may take it before it is used: callers retry
    (`launch_app`, `retry_on_a_taken_port`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_ATTEMPTS = 5


def retry_on_a_taken_port(start):
    """`start(port)` on an unused port, again on another one while it raises OSError (Gradio's "Cannot find
    empty port": the port was taken between choosing it and listening on it); the last error is raised."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            return start(unused_port())
        except OSError:
            if attempt == PORT_ATTEMPTS - 1:
                raise


def launch_app(bot, models_root):
    """Serve the Gradio app in this process on a free local port; returns (demo, url)."""
    import app

    demo = app.build_demo(bot, models_root=models_root)
    _, url, _ = retry_on_a_taken_port(lambda port: demo.launch(
        prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.LAUNCH_OPTIONS))
    return demo, url
