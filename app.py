"""The Gradio web app: chat with a trained model, look at its attention, retrain it on your own CSV.

Owns the browser UI only: the layout of the chat, attention and retrain tabs, the `/chat` API, the limits,
the queue and the event wiring. Models, uploads and background training live in `chatbot.app.workspace`,
heatmaps in `chatbot.app.plots`. Must not hold model logic or import TensorFlow: the workspace imports it
on first use, so `import app` and `python app.py --help` stay cheap (matplotlib too: on the first heatmap).
"""

import argparse
import faulthandler
import dataclasses
import html
import inspect
import logging
import os
import sys
import typing
import unicodedata
from pathlib import Path

import gradio as gr

from chatbot.artifacts import ArtifactError
from chatbot.config import CONTEXT_TURNS, Compilation, GenerationConfig, SettingsError
from chatbot.app.controls import CONTROLS, DECODING_OPTIONS, DEFAULTS, TONE_CHOICES
from chatbot.serving.batcher import ReplyBatcher
from chatbot.data.text import normalize
from chatbot.app.workspace import (BackgroundTrainer, ModelShelf, attention_choices, available_memory_mib, load_chatbot,
                               model_summary, read_training_csv, training_config, training_memory_refusal)

APP_DIR = Path(__file__).resolve().parent
log = logging.getLogger("chatbot.app")
MODELS_ROOT = APP_DIR / "models"
DEFAULT_MODEL = MODELS_ROOT / "default"

CHAT_CLIP_CHARS = 200  # the chat cuts longer questions (the model refuses over config.MAX_QUESTION_CHARS)
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
CHAT_CONCURRENCY = 4  # streamed replies computed at once; the rest wait in the queue, in order
QUEUE_SIZE = 64
PROVENANCE_CHARS = 60  # a training question shown in the chat is cut to this many characters
POLL_SECONDS = 0.5  # how often the retrain tab refreshes its progress

EXAMPLES = ["안녕하세요", "오늘 너무 피곤해", "헤어지고 밥이 안 넘어가", "표창 받았어", "주말에 뭐 하지?"]
BAD_SETTINGS = "생성 설정 값이 올바르지 않아요"
EMPTY_REPLY = "질문을 입력해 주세요. 무엇이든 편하게 물어보세요!"
BUSY_MESSAGE = "다른 학습이 진행 중이에요. 그 학습이 끝난 뒤에 다시 시도해 주세요."
SIZE_CHOICES = [("시작 모델 위에 (추천: 다른 말로 물어도 더 잘 알아들어요, 명령줄 train과 같음)", "built-on"),
                ("처음부터 아주 작게 (시험용, 몇 초)", "tiny"), ("처음부터 작게 (CPU에서 몇 분)", "small"),
                ("처음부터 기본 크기 (설계값)", "base")]
# For demo.launch(); the handlers check sizes too. show_error: what Gradio itself refuses says why.
LAUNCH_OPTIONS = {"max_file_size": MAX_UPLOAD_BYTES, "show_error": True}


def clip_question(text: str | None, max_chars: int) -> tuple[str, str]:
    """The question as the model will see it, and a notice for the user ("" when nothing was cut)."""
    question = normalize(text or "")  # invisible characters alone are no question; a typed TURN is a space
    if len(question) <= max_chars:
        return question, ""
    return question[:max_chars], f"질문이 너무 길어서 앞의 {max_chars}자만 사용했어요."


def typed_chat_function(chat, doc: str | None = None, refuse=ValueError):
    """`chat(message, model="", **decoding)` as a plain function with one typed parameter per
    GenerationConfig field, in field order, which is what an API layer (Gradio's `gr.api`) reads:
    `(message, <GenerationConfig fields>, model, tone, history)`. Arguments that do not fit it (a missing message,
    one too many) raise `refuse(reason)`, an error the API layer shows its caller."""
    kind, types = inspect.Parameter.POSITIONAL_OR_KEYWORD, typing.get_type_hints(GenerationConfig)
    defaults = GenerationConfig()
    parameters = [inspect.Parameter("message", kind, annotation=str),
                  *(inspect.Parameter(f.name, kind, default=getattr(defaults, f.name), annotation=types[f.name])
                    for f in dataclasses.fields(GenerationConfig)),
                  inspect.Parameter("model", kind, default="", annotation=str),
                  inspect.Parameter("tone", kind, default="", annotation=str),
                  inspect.Parameter("history", kind, default=None, annotation=list | None)]
    signature = inspect.Signature(parameters, return_annotation=str)

    def typed_chat(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise refuse(f"the request does not fit /chat({', '.join(signature.parameters)}): {error}") from None
        bound.apply_defaults()
        return chat(**bound.arguments)

    typed_chat.__signature__, typed_chat.__doc__ = signature, doc
    typed_chat.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": str}
    return typed_chat


def question_of(text: str | None) -> str:
    """The question as the model will see it (`clip_question`), telling the user when it was cut."""
    question, notice = clip_question(text, CHAT_CLIP_CHARS)
    if notice:
        gr.Warning(notice)
    return question


def decoding_settings(values: dict) -> GenerationConfig:
    """The checked settings for `Chatbot.reply`/`stream` from UI values (missing ones take their defaults),
    built once per request. A missing or negative seed becomes None: the model draws a fresh one."""
    try:
        return GenerationConfig.from_values(values)
    except (TypeError, ValueError) as error:
        raise refused(error, BAD_SETTINGS) from None


def refused(reason, what: str = "요청을 처리할 수 없어요") -> gr.Error:
    """A request the app refuses: the reason is the caller's (toasts render HTML); the server log gets one line,
    never a traceback (a visitor's mistake is not the server's)."""
    log.warning("refused: %s: %s", what, " ".join(str(reason).split())[:300])
    return gr.Error(f"{what}: {html.escape(str(reason))}", print_exception=False)


def as_text(text: str) -> str:
    """Chat messages are shown as text: escape HTML so a reply or question can never inject markup."""
    return html.escape(text, quote=False)


def shown_briefly(text: str, limit: int = PROVENANCE_CHARS) -> str:
    """A training question as the provenance line shows it: no invisible characters (direction overrides,
    zero-width marks, controls), at most `limit` characters."""
    visible = "".join(char for char in text if unicodedata.category(char) not in ("Cc", "Cf", "Co", "Cs"))
    visible = " ".join(visible.split())
    return visible if len(visible) <= limit else visible[:limit - 1] + "…"


class ChatApp:
    """What the UI does, independent of the layout: every event handler of the demo."""

    def __init__(self, bot, models_root: str | Path, prepare_models: bool = False, upload_folders=None):
        # the only files the retrain tab reads: what visitors uploaded (Gradio's upload folder)
        self.upload_folders = upload_folders or (gr.utils.get_upload_folder(),)
        self.shelf = ModelShelf(models_root, bot, prepare_models)
        self.trainer = BackgroundTrainer(self.shelf.root)
        self.batcher = ReplyBatcher()

    def model(self, name: str | None):
        """The model picked by `name` (the model itself checks each request against it, once)."""
        try:
            return self.shelf.get(name)
        except (ArtifactError, OSError, ValueError) as error:
            raise refused(error, "모델을 불러오지 못했어요") from None

    def chat(self, message: str, model: str = "", tone: str = "", history: list | None = None, **decoding) -> str:
        """Answer one question with the chosen model and decoding settings; returns the reply as plain text.
        An empty `model` means the model the app started with; `tone` is everyday, sad, love or "" (none);
        `history` the conversation before the message, oldest first, as [{"role": "user" | "assistant",
        "content": "..."}] (a model trained on dialogues reads its last two messages); a missing or negative
        `seed` draws a random one."""
        if not isinstance(message, str):
            raise refused(f"message must be a string, got {type(message).__name__}")
        question = question_of(message)
        if not question:
            return EMPTY_REPLY
        settings, tone = decoding_settings(decoding), tone or None
        bot = self.model(model)
        try:
            return self.batcher.reply(bot, question, tone, settings, history)
        except SettingsError as error:  # a tone or an option this model refuses: before any batch
            raise refused(error, BAD_SETTINGS) from None
        except ValueError as error:  # the question or history itself: refused before any batch
            raise refused(error) from None

    def respond(self, message, history, conversation, model_name, tone, *settings):
        """Stream the reply into the chat, token by token. `conversation`: the messages so far as the model reads
        them (the chat shows them escaped, with notes); `settings` are the decoding options in DECODING_OPTIONS
        order. Yields (history, cleared textbox, last exchange, conversation)."""
        question, history, conversation = question_of(message), list(history or []), list(conversation or [])
        if not question:
            yield [*history, {"role": "assistant", "content": EMPTY_REPLY}], "", gr.skip(), gr.skip()
            return
        checked, tone = decoding_settings(dict(zip(DECODING_OPTIONS, settings))), tone or None
        history += [{"role": "user", "content": as_text(question)}, {"role": "assistant", "content": ""}]
        reply, bot = "", self.model(model_name)
        earlier = conversation[-2 * CONTEXT_TURNS:]  # more than the model reads, never the whole chat
        try:
            for reply in bot.stream(question, tone, checked, history=earlier):
                history[-1] = {"role": "assistant", "content": as_text(reply)}
                yield history, "", gr.skip(), gr.skip()
        except SettingsError as error:  # checked before the first token
            raise refused(error, BAD_SETTINGS) from None
        except ValueError as error:  # the question or conversation itself, refused before any decoding
            raise refused(error) from None
        conversation = [*earlier, {"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        source = bot.provenance(question, reply, earlier)  # a learner sees what the model copied and what it wrote
        if source["fallback"]:
            history[-1]["content"] += as_text("\n(학습한 질문 중 뜻이 가까운 것이 없어 정해 둔 답을 했어요 · 가장 가까운 질문: "
                                              f"{shown_briefly(source['nearest_question'])})")
        elif source["copied"]:
            history[-1]["content"] += as_text(f"\n(학습 데이터의 답과 같음 · 비슷한 질문: "
                                              f"{shown_briefly(source['source_question'])})")
        yield history, "", (question, reply), conversation

    @staticmethod
    def new_conversation():
        """An empty chat and conversation: the next message starts a conversation of its own."""
        return [], "", None, []

    def models(self) -> list[str]:
        """The model names the picker offers ("" is the startup model when it lives outside models/)."""
        return [value for _, value in self.shelf.choices()]

    def select_model(self, name: str):
        """Load the picked model; returns its summary and the layer and head choices."""
        bot = self.model(name)
        layers, heads = attention_choices(bot)
        return model_summary(name, bot), gr.Dropdown(choices=layers, value=1), gr.Dropdown(choices=heads, value=1)

    def refresh_models(self, current: str | None):
        """The picker with the model directories now on disk, keeping the current pick if it still exists."""
        return gr.Dropdown(choices=self.shelf.choices(),
                           value=current if current in self.models() else self.shelf.startup_name)

    def attention(self, text: str, last_exchange, model_name: str, view: str, layer: int, head: int):
        """Heatmap of the reply's attention over the question: the typed question, else the last chat one."""
        question, reply = question_of(text), None
        if not question and last_exchange:
            question, reply = last_exchange
        if not question:
            raise refused("질문을 입력하거나, 먼저 대화 탭에서 질문해 주세요.", "어텐션을 그릴 질문이 없어요")
        result = self.model(model_name).attention(question, reply)
        from chatbot.app.plots import attention_figure, draw, korean_font  # matplotlib: on the first heatmap
        grid = view == "grid"
        figure = draw(attention_figure(result, None if grid else layer, None if grid else head))
        caption = f"질문: {question}\n답변: {result['reply']}"
        if korean_font() is None:
            caption += "\n(한글 글꼴이 없어 토큰이 네모로 보일 수 있어요: fonts-nanum 을 설치하세요)"
        return figure, caption

    def check_csv(self, path: str | None) -> str:
        return read_training_csv(path, MAX_UPLOAD_BYTES, self.upload_folders)[1] if path else ""  # no file: no report

    def train(self, path: str | None, epochs: int = 0, size: str = "built-on", progress=gr.Progress()):
        """Check the CSV, train in the background, report progress until done. Yields (log, model picker)."""
        pairs, message = read_training_csv(path, MAX_UPLOAD_BYTES, self.upload_folders)
        if pairs is None:
            yield message, gr.skip()
            return
        try:
            config = training_config(epochs, size)
        except ValueError as error:
            raise refused(error) from None
        too_big = training_memory_refusal(len(pairs), available_memory_mib())
        if too_big:  # said before the run starts: one that ran out of memory would take the chat down with it
            yield f"{message}\n\n{too_big}", gr.skip()
            return
        base = self.shelf.startup_bot.path if size == "built-on" else None  # the model the app opened with
        job = self.trainer.start(pairs, config, Path(path).stem, base)
        if job is None:
            yield BUSY_MESSAGE, gr.skip()
            return
        yield f"{message}\n\n{job.summary()}", gr.skip()
        while not job.finished.wait(POLL_SECONDS):
            progress(job.fraction(), desc=f"에포크 {job.epoch}/{job.epochs}")
            yield f"{message}\n\n{job.summary()}", gr.skip()
        yield f"{message}\n\n{job.summary()}", gr.Dropdown(choices=self.shelf.choices())


def build_demo(bot, models_root: str | Path = MODELS_ROOT, prepare_models: bool = False) -> gr.Blocks:
    """The whole app around a loaded `Chatbot`; the picker lists the model directories under `models_root`."""
    ui = ChatApp(bot, models_root, prepare_models)
    chat_limits = dict(concurrency_id="chat", concurrency_limit=CHAT_CONCURRENCY)
    with gr.Blocks(title="한국어 트랜스포머 챗봇", analytics_enabled=False) as demo:
        gr.Markdown("# 한국어 트랜스포머 챗봇\n작은 트랜스포머 모델과 대화하고, 어텐션을 살펴보고, 내 데이터로 다시 학습해 보세요.")
        last_exchange = gr.State(None)
        conversation = gr.State([])  # the chat's messages as the model reads them (`ChatApp.respond`)
        with gr.Tab("대화"):
            with gr.Row():
                with gr.Column(scale=3):
                    chatbot = gr.Chatbot(label="대화", height=420, render_markdown=False, sanitize_html=True,
                                         latex_delimiters=[],  # "$$\\Huge ..." in training text stays text
                                         feedback_options=None, buttons=["copy"], elem_id="chat")
                    with gr.Row():
                        message = gr.Textbox(show_label=False, scale=5, elem_id="question",
                                             placeholder=f"질문을 입력하고 Enter를 누르세요 (최대 {CHAT_CLIP_CHARS}자)")
                        send = gr.Button("보내기", variant="primary", scale=1)
                    gr.Examples(EXAMPLES, inputs=message, label="예시 질문")
                    new = gr.Button("새 대화", elem_id="new-conversation")
                with gr.Column(scale=2):
                    with gr.Row():
                        picker = gr.Dropdown(ui.shelf.choices(), value=ui.shelf.startup_name, label="모델",
                                             scale=4, elem_id="model-picker",
                                             allow_custom_value=True)  # ModelShelf.get is the guard
                        refresh = gr.Button("새로고침", scale=1, min_width=80)
                    info = gr.Markdown(model_summary(ui.shelf.startup_name, bot))
                    tone = gr.Radio(TONE_CHOICES, value="", label="말투 (라벨로 학습한 모델)", elem_id="tone")
                    with gr.Accordion("생성 설정", open=True):  # a control per option, in DECODING_OPTIONS order
                        settings = [CONTROLS[name](getattr(DEFAULTS, name)) for name in DECODING_OPTIONS]
        with gr.Tab("어텐션"):
            gr.Markdown("답변의 각 토큰이 질문의 어느 토큰을 보았는지 (인코더-디코더 어텐션). "
                        "질문을 비워 두면 대화 탭의 마지막 질문과 답변을 씁니다.")
            with gr.Row():
                attention_question = gr.Textbox(label="질문 (비우면 마지막 질문)", scale=3)
                view = gr.Radio([("층·헤드 하나", "one"), ("모든 층·헤드", "grid")], value="one", label="보기")
                layers, heads = attention_choices(bot)
                layer = gr.Dropdown(layers, value=1, label="층")
                head = gr.Dropdown(heads, value=1, label="헤드")
            show = gr.Button("어텐션 보기", variant="primary")
            caption = gr.Textbox(label="질문과 답변", lines=2, interactive=False)
            plot = gr.Plot(label="어텐션 지도")
        with gr.Tab("다시 학습"):
            gr.Markdown(f"질문·답변 CSV(`Q,A[,label]`, UTF-8 또는 cp949, 최대 {MAX_UPLOAD_BYTES // 2**20} MB)를 "
                        "올리면 새 모델을 학습해 `models/` 아래에 저장합니다. 학습 중에도 대화는 계속됩니다.")
            upload = gr.File(label="Q&A CSV", file_types=[".csv"], type="filepath")
            report = gr.Textbox(label="데이터 보고서", lines=8, interactive=False)
            epochs = gr.Slider(0, 300, value=0, step=1, label="에포크 (0 = 데이터 크기에 맞춰 자동)")
            with gr.Accordion("고급", open=False):
                size = gr.Radio(SIZE_CHOICES, value="built-on", label="무엇에서 시작할까요")
            start = gr.Button("학습 시작", variant="primary")
            training_log = gr.Textbox(label="학습 진행", lines=12, interactive=False)

        replies = [trigger(ui.respond, [message, chatbot, conversation, picker, tone, *settings],
                           [chatbot, message, last_exchange, conversation], api_visibility="private", **chat_limits)
                   for trigger in (message.submit, send.click)]
        # A reply still streaming is cancelled first: finishing after the click, it would put back the conversation
        # the user just left (and the next message would be read with it).
        new.click(ui.new_conversation, None, [chatbot, message, last_exchange, conversation], api_visibility="private",
                  queue=False, cancels=replies)
        picker.change(ui.select_model, picker, [info, layer, head], api_visibility="private", **chat_limits)
        refresh.click(ui.refresh_models, picker, picker, api_visibility="private")
        demo.load(ui.refresh_models, picker, picker, api_visibility="private")
        show.click(ui.attention, [attention_question, last_exchange, picker, view, layer, head], [plot, caption],
                   api_name="attention", **chat_limits)
        upload.upload(ui.check_csv, upload, report, api_name="check_data")
        start.click(ui.train, [upload, epochs, size], [training_log, picker], api_name="train",
                    concurrency_id="train", concurrency_limit=None)  # the trainer's lock turns a second one away
        # Not through Gradio's queue: its events cost more server time per request than a batched reply
        # (bench/load_app.py). Gradio's thread pool takes up to 40 requests at once; the batcher decodes them together.
        gr.api(typed_chat_function(ui.chat, ChatApp.chat.__doc__, refused), api_name="chat", queue=False)
        gr.api(ui.models, api_name="models")
    demo.queue(default_concurrency_limit=CHAT_CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


def create_demo(model_dir: str | Path = DEFAULT_MODEL, models_root: str | Path = MODELS_ROOT) -> gr.Blocks:
    return build_demo(load_chatbot(model_dir, Compilation.WARMED, prepare=True), models_root, prepare_models=True)


def __getattr__(name: str):
    """`app.demo` (as `gradio app.py` expects) is built on first access, so importing app stays cheap."""
    if name == "demo":
        globals()["demo"] = create_demo()
        return globals()["demo"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="한국어 트랜스포머 챗봇 웹 앱 (Gradio)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), metavar="DIR",
                        help="model directory to start with (default: models/default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default: 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument("--no-warm-up", action="store_true", help="compile each batch shape when first asked")
    parser.add_argument("--no-xla", action="store_true", help="decode as a plain graph: no compiling, slower replies")
    args = parser.parse_args(argv)
    try:
        # XLA only once the warm-up compiled it, so no request waits; --no-warm-up compiles when first asked.
        compilation = Compilation.GRAPH if args.no_xla else Compilation.XLA if args.no_warm_up else Compilation.WARMED
        bot = load_chatbot(args.model, compilation)
    except ArtifactError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)
    if not args.no_warm_up:  # until then, plain graphs: the /chat reply's is traced before the page is served
        bot.trace_first_replies(streamed=False)
    demo = build_demo(bot, prepare_models=not args.no_warm_up)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=True,
                **LAUNCH_OPTIONS)
    try:
        if not args.no_warm_up:
            bot.warm_up_in_background()  # the streamed reply's graphs, then XLA: requests take plain graphs till then
        demo.block_thread()  # until Ctrl-C, which closes the server
    except KeyboardInterrupt:  # Ctrl-C before `block_thread` was waiting for it: requests may already have come
        demo.close()


if __name__ == "__main__":
    faulthandler.enable()  # a fatal signal, or a supervisor's SIGABRT, prints every thread's Python stack
    main()
    # Another thread (the warm-up, a retrain) may be inside TensorFlow, where the interpreter's exit aborts; models
    # are written atomically, so this ends as a kill would (here, not in `main`, which tests call in-process).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
