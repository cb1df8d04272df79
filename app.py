"""The Gradio web app: chat with a trained model, look at its attention, retrain it on your own CSV.

Owns the browser UI only: the chat tab (streamed replies, decoding settings, the model picker and the
`/chat` API endpoint), the attention tab (cross-attention heatmaps), the retrain tab (CSV check,
one background training at a time, new model directories under `models/`), input limits and the
queue. Model logic lives in the `chatbot` package; this file only calls it. TensorFlow is imported
on first use, so `import app` and `python app.py --help` stay cheap.

    python app.py [--model models/default] [--host 127.0.0.1] [--port 7860] [--share]
"""

import argparse
import html
import os
import re
import secrets
import shutil
import sys
import threading
import time
import warnings
from functools import cache
from pathlib import Path

import gradio as gr
from matplotlib import font_manager
from matplotlib.figure import Figure

from chatbot.artifacts import CONFIG_FILE, ArtifactError, check_model_dir
from chatbot.config import ChatbotConfig, DataConfig, GenerationConfig, ModelConfig, TokenizerConfig, TrainConfig
from chatbot.data import DataError, load_pairs

APP_DIR = Path(__file__).resolve().parent
MODELS_ROOT = APP_DIR / "models"
DEFAULT_MODEL = MODELS_ROOT / "default"

MAX_QUESTION_CHARS = 200
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
CHAT_CONCURRENCY = 4  # replies computed at once; the rest wait in the queue, in order
QUEUE_SIZE = 64
POLL_SECONDS = 0.5  # how often the retrain tab refreshes its progress

EXAMPLES = ["안녕하세요", "오늘 너무 피곤해", "헤어지고 밥이 안 넘어가", "표창 받았어", "주말에 뭐 하지?"]
EMPTY_REPLY = "질문을 입력해 주세요. 무엇이든 편하게 물어보세요!"
BUSY_MESSAGE = "다른 학습이 진행 중이에요. 그 학습이 끝난 뒤에 다시 시도해 주세요."
STRATEGIES = [("탐욕 (greedy)", "greedy"), ("빔 서치 (beam)", "beam"), ("샘플링 (sample)", "sample")]
DEFAULTS = GenerationConfig()
LAUNCH_OPTIONS = {"max_file_size": MAX_UPLOAD_BYTES}  # pass to demo.launch(); the handlers check sizes too

KOREAN_FONTS = ("NanumGothic", "NanumBarunGothic", "Noto Sans CJK KR", "Noto Sans KR", "Noto Sans CJK JP",
                "Noto Sans CJK SC", "UnDotum", "Baekmuk Gulim")
KOREAN_FONT_FILES = re.compile(r"nanum|notosanscjk|notoserifcjk|notosanskr|undotum|baekmuk", re.IGNORECASE)


# -- input limits and decoding settings -------------------------------------------------------

def clip_question(text: str | None) -> tuple[str, str]:
    """The question as the model will see it, and a notice for the user ("" when nothing was cut)."""
    question = (text or "").strip()
    if len(question) <= MAX_QUESTION_CHARS:
        return question, ""
    return question[:MAX_QUESTION_CHARS], f"질문이 너무 길어서 앞의 {MAX_QUESTION_CHARS}자만 사용했어요."


def decoding_options(strategy=DEFAULTS.strategy, num_beams=DEFAULTS.num_beams, temperature=DEFAULTS.temperature,
                     top_k=DEFAULTS.top_k, top_p=DEFAULTS.top_p, repetition_penalty=DEFAULTS.repetition_penalty,
                     max_new_tokens=DEFAULTS.max_new_tokens, seed=None) -> dict:
    """Keyword arguments for `Chatbot.reply`/`stream`, checked. A missing or negative seed draws a fresh
    one here, so the app's randomness does not depend on the global seed that training resets."""
    if seed is None or seed == "" or int(seed) < 0:
        seed = secrets.randbelow(2**31 - 1)
    options = dict(strategy=strategy, num_beams=int(num_beams), temperature=float(temperature), top_k=int(top_k),
                   top_p=float(top_p), repetition_penalty=float(repetition_penalty),
                   max_new_tokens=int(max_new_tokens), seed=int(seed))
    try:
        GenerationConfig(**options)
    except (TypeError, ValueError) as error:
        raise gr.Error(f"생성 설정 값이 올바르지 않아요: {error}") from None
    return options


def as_text(text: str) -> str:
    """Chat messages are shown as text: escape HTML so a reply or question can never inject markup."""
    return html.escape(text, quote=False)


# -- models under models/ --------------------------------------------------------------------

class ModelShelf:
    """The models the app answers with: the startup model, and every model directory directly under
    `root` (a non-hidden folder holding config.json). Each is loaded once and then shared."""

    def __init__(self, root: str | Path, startup_bot):
        self.root = Path(root).resolve()
        self.startup_bot = startup_bot
        startup_path = Path(startup_bot.path).resolve() if startup_bot.path else None
        self.startup_name = startup_path.name if startup_path and startup_path.parent == self.root else ""
        self._label = f"{startup_path.name if startup_path else '모델'} (시작 모델)"
        self._bots = {"": startup_bot, self.startup_name: startup_bot}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(path.name for path in self.root.iterdir()
                      if path.is_dir() and not path.name.startswith(".") and (path / CONFIG_FILE).is_file())

    def choices(self) -> list[tuple[str, str]]:
        """(label, value) pairs for the picker; "" stands for a startup model that lives outside the root."""
        named = [(name, name) for name in self.names()]
        return named if self.startup_name else [(self._label, ""), *named]

    def get(self, name: str | None):
        """The model called `name` (a picker value), loading it on first use."""
        from chatbot.generate import Chatbot

        name = name or ""
        with self._lock:
            if name not in self._bots:
                if name not in self.names():
                    raise ArtifactError(f"{name!r}: {self.root.name}/ 아래에 그런 모델이 없어요")
                self._bots[name] = Chatbot.load(self.root / name)
            return self._bots[name]

    def reload(self, name: str | None, stale):
        """Load `stale` again from its directory, unless another request already has."""
        from chatbot.generate import Chatbot

        with self._lock:
            current = self._bots.get(name or "")
            if current is not stale or stale.path is None:
                return current
            fresh = Chatbot.load(stale.path)
            for key in [key for key, bot in self._bots.items() if bot is stale]:
                self._bots[key] = fresh
            return fresh


def lost_tokenizer(error: Exception) -> bool:
    """True for the error a loaded model raises after `tf.random.set_seed` cleared TensorFlow's kernel
    cache, and with it the SentencePiece resource its tokenizer was using. `train()` avoids that call,
    but any code in this process may make it (`keras.utils.set_random_seed` does)."""
    return type(error).__name__ == "NotFoundError" and "SentencepieceOp" in str(error)


def model_summary(name: str, bot) -> str:
    model = bot.config.model
    text = (f"**{html.escape(name or Path(str(bot.path)).name)}** · 층 {model.num_layers} · d_model {model.d_model} · "
            f"헤드 {model.num_heads} · 어휘 {model.vocab_size:,}개 · 최대 {model.max_length} 토큰")
    return text


# -- attention heatmaps ----------------------------------------------------------------------

@cache
def korean_font() -> str | None:
    """A font family with Hangul, or None. Also finds fonts installed after matplotlib built its cache."""
    names = {font.name for font in font_manager.fontManager.ttflist}
    if not names.intersection(KOREAN_FONTS):
        for path in font_manager.findSystemFonts():
            if KOREAN_FONT_FILES.search(Path(path).name):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue
        names = {font.name for font in font_manager.fontManager.ttflist}
    return next((name for name in KOREAN_FONTS if name in names), None)


def attention_figure(result: dict, layer: int | None = None, head: int | None = None) -> Figure:
    """Heatmaps of cross-attention (reply tokens × question tokens): one layer/head (1-based), or
    every layer and head as a grid when `layer` is None."""
    weights = result["weights"]  # (layers, heads, reply, question)
    num_layers, num_heads = weights.shape[:2]
    if layer is None:
        cells = [(l, h) for l in range(num_layers) for h in range(num_heads)]
        rows, cols = num_layers, num_heads
    else:
        cells = [(min(max(int(layer), 1), num_layers) - 1, min(max(int(head or 1), 1), num_heads) - 1)]
        rows = cols = 1
    question, reply = result["question_tokens"], result["reply_tokens"]
    font = korean_font()
    cell_w, cell_h = max(3.0, 0.45 * len(question) + 1.5), max(2.5, 0.35 * len(reply) + 1.2)
    figure = Figure(figsize=(min(cell_w * cols, 24), min(cell_h * rows, 30)), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    family = [font, "DejaVu Sans"] if font else ["DejaVu Sans"]
    vmax = max(float(weights[l, h].max()) for l, h in cells) or 1.0  # one colour scale for every panel
    rotation = 0 if max(map(len, question)) <= 3 else 90
    for ax, (l, h) in zip(axes.flat, cells):
        image = ax.imshow(weights[l, h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(question)), question, rotation=rotation, fontfamily=family, fontsize=9)
        ax.set_yticks(range(len(reply)), reply, fontfamily=family, fontsize=9)
        ax.set_title(f"층 {l + 1} · 헤드 {h + 1}", fontfamily=family, fontsize=10)
    figure.colorbar(image, ax=axes, shrink=0.6)
    figure.supxlabel("질문 토큰", fontfamily=family)
    figure.supylabel("답변 토큰", fontfamily=family)
    return figure


def render_png(figure: Figure) -> Figure:
    """Draw once now with missing-glyph warnings silenced (no Korean font: boxes instead of a crash)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Gg]lyph.*missing.*")
        warnings.filterwarnings("ignore", message=".*findfont.*")
        figure.canvas.draw()
    return figure


# -- training in the background --------------------------------------------------------------

# Dropout off: in the few hundred steps of a web-UI run it slowed learning on small CSVs many times
# over (measured on the bundled set). "base" is the design model with the warmup of models/default.
TRAINING_SIZES = {  # name: (model, tokenizer vocabulary target, batch size, warmup steps)
    "tiny": (ModelConfig(num_layers=1, d_model=32, num_heads=2, dff=64, dropout=0.0, max_length=24), 2000, 16, 50),
    "small": (ModelConfig(num_layers=2, d_model=64, num_heads=4, dff=256, dropout=0.0), 4000, 32, 400),
    "base": (ModelConfig(dropout=0.0), 4000, 32, 4000),
}
SIZE_CHOICES = [("아주 작게 (시험용, 몇 초)", "tiny"), ("작게 (CPU에서 몇 분)", "small"), ("기본 (설계값, GPU 권장)", "base")]


def training_config(epochs: int, size: str = "small") -> ChatbotConfig:
    """The settings a retrain from the web UI uses, by model size."""
    if size not in TRAINING_SIZES:
        raise gr.Error(f"모델 크기는 {', '.join(TRAINING_SIZES)} 중 하나여야 해요 (받은 값: {size!r})")
    model, vocab_size, batch_size, warmup_steps = TRAINING_SIZES[size]
    return ChatbotConfig(model=model, tokenizer=TokenizerConfig(vocab_size=vocab_size), data=DataConfig(),
                         train=TrainConfig(epochs=max(1, int(epochs)), batch_size=batch_size,
                                           warmup_steps=warmup_steps))


def unique_model_dir(root: Path, stem: str) -> Path:
    """models/<stem>-YYYYmmdd-HHMMSS, with a -2, -3... suffix if that is taken."""
    stem = re.sub(r"[^\w-]+", "-", stem).strip("-_")[:40] or "model"
    base = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, number = root / base, 1
    while candidate.exists() or candidate.with_name(candidate.name + ".training").exists():
        number += 1
        candidate = root / f"{base}-{number}"
    return candidate


class TrainingJob:
    """One background training run: progress, live loss and outcome, read by the polling UI."""

    def __init__(self, out_dir: Path, epochs: int):
        self.out_dir, self.epochs = out_dir, epochs
        self.epoch = self.batch = 0
        self.lines: list[str] = [f"새 모델: {out_dir.name} (에포크 {epochs})"]
        self.error = ""
        self.finished = threading.Event()

    def log(self, message: str) -> None:
        self.lines.append(str(message))

    def end_epoch(self, epoch: int, logs: dict) -> None:
        self.epoch, self.batch = epoch, 0
        metrics = " · ".join(f"{name} {value:.4f}" for name, value in logs.items()
                             if isinstance(value, (int, float)) and name != "learning_rate")
        self.lines.append(f"에포크 {epoch}/{self.epochs} · {metrics}")

    def fraction(self) -> float:
        return min(self.epoch / self.epochs, 1.0)

    def summary(self) -> str:
        if not self.finished.is_set():
            tail = f"학습 중... 에포크 {self.epoch + 1}/{self.epochs}, 배치 {self.batch}"
        elif self.error:
            tail = f"error: 학습에 실패했어요: {self.error}"
        else:
            tail = f"학습 완료! 채팅 탭의 모델 목록에서 '{self.out_dir.name}'을(를) 고를 수 있어요."
        return "\n".join([*self.lines, tail])


def progress_callback(job: TrainingJob):
    """A Keras callback that copies each batch and epoch into `job`."""
    import keras

    class LiveProgress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            job.batch = batch + 1

        def on_epoch_end(self, epoch, logs=None):
            job.end_epoch(epoch + 1, logs or {})

    return LiveProgress()


class Trainer:
    """Runs at most one training at a time, in a background thread, writing under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def start(self, pairs, config: ChatbotConfig, stem: str) -> TrainingJob | None:
        """Start training and return its job, or None when another training is running."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            job = TrainingJob(unique_model_dir(self.root, stem), config.train.epochs)
            threading.Thread(target=self._run, args=(job, pairs, config), daemon=True,
                             name=f"train-{job.out_dir.name}").start()
        except BaseException:
            self._lock.release()
            raise
        return job

    def _run(self, job: TrainingJob, pairs, config: ChatbotConfig) -> None:
        from chatbot.train import state_dir_for, train

        try:
            train(pairs, config, job.out_dir, callbacks=[progress_callback(job)], verbose=0, log=job.log)
        except Exception as error:  # shown in the UI; the half-done run is of no use to a web user
            job.error = f"{type(error).__name__}: {error}"
            shutil.rmtree(state_dir_for(job.out_dir), ignore_errors=True)
        finally:
            self._lock.release()
            job.finished.set()


# -- the event handlers ----------------------------------------------------------------------

class ChatApp:
    """What the UI does, independent of the layout: every event handler of the demo."""

    def __init__(self, bot, models_root: str | Path):
        self.shelf = ModelShelf(models_root, bot)
        self.trainer = Trainer(self.shelf.root)

    def model(self, name: str | None):
        try:
            return self.shelf.get(name)
        except (ArtifactError, OSError, ValueError) as error:
            raise gr.Error(f"모델을 불러오지 못했어요: {error}") from None

    def with_model(self, name: str | None, use):
        """`use(bot)` with the named model. If the model's tokenizer was dropped (see `lost_tokenizer`),
        load the model again and retry once."""
        bot = self.model(name)
        try:
            return use(bot)
        except Exception as error:
            if not lost_tokenizer(error):
                raise
        return use(self.shelf.reload(name, bot))

    def stream(self, name: str | None, question: str, options: dict):
        """`Chatbot.stream` with the same retry as `with_model` (a retried reply starts over)."""
        bot = self.model(name)
        try:
            yield from bot.stream(question, **options)
            return
        except Exception as error:
            if not lost_tokenizer(error):
                raise
        yield from self.shelf.reload(name, bot).stream(question, **options)

    def chat(self, message: str, strategy: str = DEFAULTS.strategy, num_beams: int = DEFAULTS.num_beams,
             temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k, top_p: float = DEFAULTS.top_p,
             repetition_penalty: float = DEFAULTS.repetition_penalty, max_new_tokens: int = DEFAULTS.max_new_tokens,
             seed: int | None = None, model: str = "") -> str:
        """Answer one question with the chosen model and decoding settings; returns the reply as plain text.
        An empty `model` means the model the app started with; a missing or negative `seed` draws a random one."""
        question, notice = clip_question(message)
        if notice:
            gr.Warning(notice)
        if not question:
            return EMPTY_REPLY
        options = decoding_options(strategy, num_beams, temperature, top_k, top_p, repetition_penalty,
                                   max_new_tokens, seed)
        return self.with_model(model, lambda bot: bot.reply(question, **options))

    def respond(self, message, history, model_name, *settings):
        """Stream the reply into the chat, token by token. Yields (history, cleared textbox, last exchange)."""
        question, notice = clip_question(message)
        history = list(history or [])
        if notice:
            gr.Warning(notice)
        if not question:
            yield [*history, {"role": "assistant", "content": EMPTY_REPLY}], "", gr.skip()
            return
        options = decoding_options(*settings)
        history += [{"role": "user", "content": as_text(question)}, {"role": "assistant", "content": ""}]
        reply = ""
        for reply in self.stream(model_name, question, options):
            history[-1] = {"role": "assistant", "content": as_text(reply)}
            yield history, "", gr.skip()
        yield history, "", (question, reply)

    def models(self) -> list[str]:
        """The model names the picker offers ("" is the startup model when it lives outside models/)."""
        return [value for _, value in self.shelf.choices()]

    def select_model(self, name: str):
        """Load the picked model; returns its summary and the layer and head choices."""
        bot = self.model(name)
        model = bot.config.model
        return (model_summary(name, bot), gr.Dropdown(choices=numbered(model.num_layers), value=1),
                gr.Dropdown(choices=numbered(model.num_heads), value=1))

    def refresh_models(self, current: str | None):
        """The picker with the model directories now on disk, keeping the current pick if it still exists."""
        return gr.Dropdown(choices=self.shelf.choices(),
                           value=current if current in self.models() else self.shelf.startup_name)

    def attention(self, text: str, last_exchange, model_name: str, view: str, layer: int, head: int):
        """Heatmap of the reply's attention over the question: the typed question, else the last chat one."""
        question, notice = clip_question(text)
        reply = None
        if not question and last_exchange:
            question, reply = last_exchange
        if notice:
            gr.Warning(notice)
        if not question:
            raise gr.Error("질문을 입력하거나, 먼저 대화 탭에서 질문해 주세요.")
        result = self.with_model(model_name, lambda bot: bot.attention(question, reply))
        grid = view == "grid"
        figure = render_png(attention_figure(result, None if grid else layer, None if grid else head))
        caption = f"질문: {question}\n답변: {result['reply']}"
        if korean_font() is None:
            caption += "\n(한글 글꼴이 없어 토큰이 네모로 보일 수 있어요: fonts-nanum 을 설치하세요)"
        return figure, caption

    def read_csv(self, path: str | None):
        """(pairs, message): the loader's pairs and data report, or (None, 'error: ...')."""
        if not path:
            return None, "error: CSV 파일을 먼저 올려 주세요."
        file, name = Path(path), Path(path).name
        size = file.stat().st_size
        if size > MAX_UPLOAD_BYTES:
            return None, (f"error: {name}: 파일이 너무 커요 ({size / 2**20:.1f} MB). "
                          f"{MAX_UPLOAD_BYTES // 2**20} MB 이하의 CSV만 올릴 수 있어요.")
        try:
            pairs, report = load_pairs(file)
        except DataError as error:
            where = name if error.row is None else f"{name}:{error.row}"
            return None, f"error: {where}: {error.reason}"
        report.path = name  # not the server's temporary upload path
        return pairs, str(report)

    def check_csv(self, path: str | None) -> str:
        return self.read_csv(path)[1] if path else ""

    def train(self, path: str | None, epochs: int = 30, size: str = "small", progress=gr.Progress()):
        """Check the CSV, train in the background, report progress until done. Yields (log, model picker)."""
        pairs, message = self.read_csv(path)
        if pairs is None:
            yield message, gr.skip()
            return
        job = self.trainer.start(pairs, training_config(epochs, size), Path(path).stem)
        if job is None:
            yield BUSY_MESSAGE, gr.skip()
            return
        yield f"{message}\n\n{job.summary()}", gr.skip()
        while not job.finished.wait(POLL_SECONDS):
            progress(job.fraction(), desc=f"에포크 {job.epoch}/{job.epochs}")
            yield f"{message}\n\n{job.summary()}", gr.skip()
        yield f"{message}\n\n{job.summary()}", gr.Dropdown(choices=self.shelf.choices())


# -- layout ----------------------------------------------------------------------------------

def numbered(count: int) -> list[int]:
    return list(range(1, count + 1))


def settings_panel() -> list:
    """The decoding settings, in `decoding_options` order."""
    with gr.Accordion("생성 설정", open=True):
        strategy = gr.Radio(STRATEGIES, value=DEFAULTS.strategy, label="디코딩 방식")
        num_beams = gr.Slider(1, 8, value=DEFAULTS.num_beams, step=1, label="빔 너비 (빔 서치)")
        temperature = gr.Slider(0.1, 3.0, value=DEFAULTS.temperature, step=0.05, label="온도 (샘플링)")
        top_k = gr.Slider(0, 100, value=DEFAULTS.top_k, step=1, label="top-k (0 = 끔)")
        top_p = gr.Slider(0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="top-p (1 = 끔)")
        repetition = gr.Slider(1.0, 2.0, value=DEFAULTS.repetition_penalty, step=0.05, label="반복 억제")
        max_tokens = gr.Slider(1, 100, value=DEFAULTS.max_new_tokens, step=1, label="최대 길이 (토큰)")
        seed = gr.Number(value=-1, precision=0, minimum=-1, label="시드 (-1 = 매번 무작위)")
    return [strategy, num_beams, temperature, top_k, top_p, repetition, max_tokens, seed]


def build_demo(bot, models_root: str | Path = MODELS_ROOT) -> gr.Blocks:
    """The whole app around a loaded `Chatbot`; the model picker lists the model directories under `models_root`."""
    ui = ChatApp(bot, models_root)
    chat_limits = dict(concurrency_id="chat", concurrency_limit=CHAT_CONCURRENCY)
    with gr.Blocks(title="한국어 트랜스포머 챗봇", analytics_enabled=False) as demo:
        gr.Markdown("# 한국어 트랜스포머 챗봇\n작은 트랜스포머 모델과 대화하고, 어텐션을 살펴보고, 내 데이터로 다시 학습해 보세요.")
        last_exchange = gr.State(None)
        with gr.Tab("대화"):
            with gr.Row():
                with gr.Column(scale=3):
                    chatbot = gr.Chatbot(label="대화", height=420, render_markdown=False, sanitize_html=True,
                                         feedback_options=None, buttons=["copy"], elem_id="chat")
                    with gr.Row():
                        message = gr.Textbox(show_label=False, scale=5, elem_id="question",
                                             placeholder=f"질문을 입력하고 Enter를 누르세요 (최대 {MAX_QUESTION_CHARS}자)")
                        send = gr.Button("보내기", variant="primary", scale=1)
                    gr.Examples(EXAMPLES, inputs=message, label="예시 질문")
                    gr.ClearButton([chatbot, message], value="대화 지우기")
                with gr.Column(scale=2):
                    with gr.Row():
                        picker = gr.Dropdown(ui.shelf.choices(), value=ui.shelf.startup_name, label="모델",
                                             scale=4, elem_id="model-picker",
                                             allow_custom_value=True)  # ModelShelf.get is the guard
                        refresh = gr.Button("새로고침", scale=1, min_width=80)
                    info = gr.Markdown(model_summary(ui.shelf.startup_name, bot))
                    settings = settings_panel()
        with gr.Tab("어텐션"):
            gr.Markdown("답변의 각 토큰이 질문의 어느 토큰을 보았는지 (인코더-디코더 어텐션). "
                        "질문을 비워 두면 대화 탭의 마지막 질문과 답변을 씁니다.")
            with gr.Row():
                attention_question = gr.Textbox(label="질문 (비우면 마지막 질문)", scale=3)
                view = gr.Radio([("층·헤드 하나", "one"), ("모든 층·헤드", "grid")], value="one", label="보기")
                layer = gr.Dropdown(numbered(bot.config.model.num_layers), value=1, label="층")
                head = gr.Dropdown(numbered(bot.config.model.num_heads), value=1, label="헤드")
            show = gr.Button("어텐션 보기", variant="primary")
            caption = gr.Textbox(label="질문과 답변", lines=2, interactive=False)
            plot = gr.Plot(label="어텐션 지도")
        with gr.Tab("다시 학습"):
            gr.Markdown(f"질문·답변 CSV(`Q,A[,label]`, UTF-8 또는 cp949, 최대 {MAX_UPLOAD_BYTES // 2**20} MB)를 "
                        "올리면 새 모델을 학습해 `models/` 아래에 저장합니다. 학습 중에도 대화는 계속됩니다.")
            upload = gr.File(label="Q&A CSV", file_types=[".csv"], type="filepath")
            report = gr.Textbox(label="데이터 보고서", lines=8, interactive=False)
            epochs = gr.Slider(1, 300, value=30, step=1, label="에포크")
            with gr.Accordion("고급", open=False):
                size = gr.Radio(SIZE_CHOICES, value="small", label="모델 크기")
            start = gr.Button("학습 시작", variant="primary")
            training_log = gr.Textbox(label="학습 진행", lines=12, interactive=False)

        chat_inputs = [message, chatbot, picker, *settings]
        chat_outputs = [chatbot, message, last_exchange]
        for trigger in (message.submit, send.click):
            trigger(ui.respond, chat_inputs, chat_outputs, api_visibility="private", **chat_limits)
        picker.change(ui.select_model, picker, [info, layer, head], api_visibility="private", **chat_limits)
        refresh.click(ui.refresh_models, picker, picker, api_visibility="private")
        demo.load(ui.refresh_models, picker, picker, api_visibility="private")
        show.click(ui.attention, [attention_question, last_exchange, picker, view, layer, head], [plot, caption],
                   api_name="attention", **chat_limits)
        upload.upload(ui.check_csv, upload, report, api_name="check_data")
        start.click(ui.train, [upload, epochs, size], [training_log, picker], api_name="train",
                    concurrency_id="train", concurrency_limit=None)  # the trainer's lock turns a second one away
        gr.api(ui.chat, api_name="chat", **chat_limits)
        gr.api(ui.models, api_name="models")
    demo.queue(default_concurrency_limit=CHAT_CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


# -- entry points ----------------------------------------------------------------------------

def load_bot(model_dir: str | Path):
    """Load a model directory; raises ArtifactError (one line) for anything that does not load."""
    check_model_dir(model_dir)  # missing files and version mismatches, before TensorFlow is imported
    from chatbot.generate import Chatbot

    try:
        return Chatbot.load(model_dir)
    except ArtifactError:
        raise
    except Exception as error:  # a corrupt model.keras and the like
        detail = " ".join(str(error).split())[:300]
        raise ArtifactError(f"{model_dir}: cannot load the model ({type(error).__name__}: {detail})") from error


def create_demo(model_dir: str | Path = DEFAULT_MODEL, models_root: str | Path = MODELS_ROOT) -> gr.Blocks:
    return build_demo(load_bot(model_dir), models_root)


def __getattr__(name: str):
    """`app.demo` (as `gradio app.py` expects) is built on first access, so importing app stays cheap."""
    if name == "demo":
        globals()["demo"] = create_demo()
        return globals()["demo"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="한국어 트랜스포머 챗봇 웹 앱 (Gradio)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), metavar="DIR",
                        help="model directory to start with (default: models/default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default: 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out of the way
    try:
        bot = load_bot(args.model)
    except ArtifactError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)
    build_demo(bot).launch(server_name=args.host, server_port=args.port, share=args.share, **LAUNCH_OPTIONS)


if __name__ == "__main__":
    main()
