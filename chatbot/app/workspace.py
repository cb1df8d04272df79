"""The app's workspace: the models it answers with, and the one training it may run in the background.

Owns: the model shelf (the startup model plus every model directory directly under a root, each
loaded once and shared, its first replies traced on load when asked: the engine owns how), the checks on
uploaded CSVs, the web
UI's training sizes and a model's layer and head numbers for the attention tab, and a background training job
with its live progress (a Keras callback) and its unique output directory. User mistakes come back as
messages or `ArtifactError`/`ValueError`, which the UI shows. TensorFlow is imported on first use (loading
or training), so importing this module, and `app`, stays cheap. Must not import Gradio, decode text itself
or draw.
"""

from __future__ import annotations

import html
import re
import shutil
import threading
import time
import typing
from pathlib import Path

from chatbot.artifacts import CONFIG_FILE, ArtifactError, check_model_dir
from chatbot.config import ChatbotConfig, Compilation, DataConfig, ModelConfig, TokenizerConfig, TrainConfig
from chatbot.data.pairs import DataError, load_pairs
from chatbot.training.sizing import fitted_to_data
from chatbot.startup import import_tensorflow_quietly


def load_chatbot(model_dir: str | Path, compilation: Compilation | str = Compilation.XLA, prepare: bool = False):
    """Load a model directory as a `Chatbot`; raises ArtifactError (one line) for anything that does not load.
    `prepare`: also trace its first replies (`Chatbot.trace_first_replies`), so its first requests do not wait."""
    check_model_dir(model_dir)  # missing files and version mismatches, before TensorFlow is imported
    import_tensorflow_quietly()  # without its start-up notes (at once when it is imported already)
    from chatbot.decoding.chatbot import Chatbot

    bot = Chatbot.load(model_dir, compilation)
    if prepare:
        bot.trace_first_replies()
    return bot


def attention_choices(bot) -> tuple[list[int], list[int]]:
    """The 1-based layer and head numbers the attention tab offers for a loaded model."""
    model = bot.config.model
    return list(range(1, model.num_layers + 1)), list(range(1, model.num_heads + 1))


def model_summary(name: str, bot) -> str:
    """One line of Markdown about a loaded model, for the picker."""
    model, context = bot.config.model, bot.config.context
    extras = (f" · 검색한 답 {context.retrieved}개 참고" if context.retrieved else "") + (" · 말투 선택 가능" if context.tone else "")
    return (f"**{html.escape(name or Path(str(bot.path)).name)}** · 층 {model.num_layers} · d_model {model.d_model} · "
            f"헤드 {model.num_heads} · 어휘 {model.vocab_size:,}개 · 최대 {model.max_length} 토큰{extras}")


class ModelShelf:
    """The models the app answers with: the startup model, and every model directory directly under
    `root` (a non-hidden folder holding config.json). Each is loaded once and then shared, and decodes
    with XLA or as a plain graph as the startup model does; with `prepare`, it is loaded with its first
    replies traced (`Chatbot.trace_first_replies`)."""

    def __init__(self, root: str | Path, startup_bot, prepare: bool = False):
        self.root = Path(root).resolve()
        self.startup_bot, self.prepare = startup_bot, prepare
        startup_path = Path(startup_bot.path).resolve() if startup_bot.path else None
        self.startup_name = startup_path.name if startup_path and startup_path.parent == self.root else ""
        self.startup_label = f"{startup_path.name if startup_path else '모델'} (시작 모델)"
        self._bots = {"": startup_bot, self.startup_name: startup_bot}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(path.name for path in self.root.iterdir()
                      if path.is_dir() and not path.name.startswith(".") and (path / CONFIG_FILE).is_file())

    def choices(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a picker; "" stands for a startup model that lives outside the root."""
        named = [(name, name) for name in self.names()]
        return named if self.startup_name else [(self.startup_label, ""), *named]

    def get(self, name: str | None):
        """The model called `name` (a picker value), loading it on first use. One model loads at a time;
        requests for models already loaded never wait for it (a load takes seconds)."""
        name = name or ""
        bot = self._bots.get(name)
        if bot is not None:
            return bot
        with self._lock:
            if name not in self._bots:
                if name not in self.names():
                    raise ArtifactError(f"{name!r}: {self.root.name}/ 아래에 그런 모델이 없어요")
                self._bots[name] = load_chatbot(self.root / name, self.startup_bot.compilation, self.prepare)
            return self._bots[name]


# -- training in the background --------------------------------------------------------------

# Model sizes a web-UI retrain offers; the schedule (batch, epochs, warmup) is chatbot.training.sizing's, as for
# the CLI. Dropout off: in a short run it slowed learning on small CSVs many times over.
BUILT_ON = "built-on"  # a retrain that builds on the startup model (`chatbot.training.train.load_base`)
TRAINING_SIZES = {  # name: (model, tokenizer vocabulary target), trained from scratch
    "tiny": (ModelConfig(num_layers=1, d_model=32, num_heads=2, dff=64, dropout=0.0, max_length=24), 2000),
    "small": (ModelConfig(num_layers=2, d_model=64, num_heads=4, dff=256, dropout=0.0), 4000),
    "base": (ModelConfig(dropout=0.0), 4000),
}


def read_training_csv(path: str | None, max_bytes: int, folders: typing.Sequence[str | Path]):
    """(pairs, data report) for an uploaded Q&A CSV, or (None, 'error: ...') naming the file (not the
    server's temporary path) and, where the loader knows it, the row. Only a file inside one of `folders`
    (the web server's upload folder) is read: a request can name any path on the server, and the report
    and a model trained on it would show that file's contents to the web."""
    if not path:
        return None, "error: CSV 파일을 먼저 올려 주세요."
    file, name = Path(path), Path(path).name
    if not inside(file, folders):
        return None, f"error: {name}: 이 앱에 올린 파일만 읽을 수 있어요. CSV 파일을 올려 주세요."
    size = file.stat().st_size
    if size > max_bytes:
        return None, (f"error: {name}: 파일이 너무 커요 ({size / 2**20:.1f} MB). "
                      f"{max_bytes // 2**20} MB 이하의 CSV만 올릴 수 있어요.")
    try:
        pairs, report = load_pairs(file)
    except DataError as error:
        where = name if error.row is None else f"{name}:{error.row}"
        return None, f"error: {where}: {error.reason}"
    report.path = name
    return pairs, str(report)


def inside(file: Path, folders: typing.Sequence[str | Path]) -> bool:
    """Whether `file`, links resolved, is a file inside one of `folders`."""
    try:
        resolved = file.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a link loop
        return False
    return resolved.is_file() and any(resolved.is_relative_to(Path(folder).resolve()) for folder in folders)


def training_config(epochs: int | None = None, size: str = BUILT_ON) -> ChatbotConfig:
    """The settings a retrain from the web UI uses, by model size (`BUILT_ON`: the app's startup model's, which
    the new model builds on); epochs 0 or None: fitted to the data."""
    if size not in (BUILT_ON, *TRAINING_SIZES):
        raise ValueError(f"모델 크기는 {', '.join((BUILT_ON, *TRAINING_SIZES))} 중 하나여야 해요 (받은 값: {size!r})")
    model, vocab_size = TRAINING_SIZES["base" if size == BUILT_ON else size]
    return ChatbotConfig(model=model, tokenizer=TokenizerConfig(vocab_size=vocab_size), data=DataConfig(),
                         train=TrainConfig(epochs=int(epochs) if epochs else None))


# The peak memory of a training run by its rows: a straight line through two full `train` runs built on the
# default model (one epoch of 10,000 and 20,000 rows: 2,457 and 3,117 MiB). A run goes in the app's own process,
# so a run that ran out of memory would take the chat down with it.
TRAINING_MIB, TRAINING_MIB_PER_1000_ROWS = 1850, 70
# A run built on a model reads meaning with multilingual-e5-small: its weights and graphs, about 1.3 GB more
# (BENCHMARKS.md, "multilingual-e5-small as a lever"), whatever the rows.
PRETRAINED_MIB = 1300
MEMORY_HEADROOM = 0.5  # of the memory available now, what a run may take: the line is an extrapolation past 20,000


def available_memory_mib() -> float | None:
    """The memory the system can give now (Linux's MemAvailable), in MiB; None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def training_memory_refusal(rows: int, available: float | None) -> str | None:
    """Why a run of `rows` pairs cannot train in `available` MiB of memory (the line the retrain tab shows, for a
    run built on the open model, so with the pretrained encoder), or None when it fits or the memory is unknown."""
    needed = TRAINING_MIB + PRETRAINED_MIB + TRAINING_MIB_PER_1000_ROWS * rows / 1000
    if available is None or needed <= MEMORY_HEADROOM * available:
        return None
    return (f"error: {rows:,}개 질문·답변을 학습하려면 메모리가 약 {needed / 1024:.1f} GB 필요한데, 지금 쓸 수 있는 메모리는 "
            f"{available / 1024:.1f} GB예요. 행을 줄이거나 명령줄에서 학습해 주세요 (python -m chatbot train).")


def unique_model_dir(root: Path, stem: str) -> Path:
    """root/<stem>-YYYYmmdd-HHMMSS, with a -2, -3... suffix if that is taken."""
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


class BackgroundTrainer:
    """Runs at most one `chatbot.training.train.train` at a time, in a background thread, writing under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def start(self, pairs, config: ChatbotConfig, stem: str, base: str | Path | None = None) -> TrainingJob | None:
        """Start training (on the model directory `base`, or from scratch) and return its job, or None when
        another training is running."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            config = fitted_to_data(config, len(pairs), built_on_base=base is not None)  # the job knows its epochs
            job = TrainingJob(unique_model_dir(self.root, stem), config.train.epochs)
            threading.Thread(target=self._run, args=(job, pairs, config, base), daemon=True,
                             name=f"train-{job.out_dir.name}").start()
        except BaseException:
            self._lock.release()
            raise
        return job

    def _run(self, job: TrainingJob, pairs, config: ChatbotConfig, base: str | Path | None) -> None:
        from chatbot.training.train import load_base, state_dir_for, train

        try:
            train(pairs, config, job.out_dir, base=None if base is None else load_base(base),
                  callbacks=[progress_callback(job)], verbose=0, log=job.log)
        except Exception as error:  # shown in the UI; the half-done run is of no use to a web user
            job.error = f"{type(error).__name__}: {error}"
            shutil.rmtree(state_dir_for(job.out_dir), ignore_errors=True)
        finally:
            self._lock.release()
            job.finished.set()
