"""The Korean tutorial notebook runs top to bottom and teaches with the package, not a copy of it.

The run uses the notebook's fast settings (CHATBOT_NOTEBOOK_FAST=1: a tiny model, two epochs) on CPU,
with `notebooks/` as the working directory, as a reader opening it in Jupyter would have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from notebook_run import START_UP_NOISE, code_cells, run_fast, stderr_of, tagged, text_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "transformer_chatbot.ipynb"
CELL_TIMEOUT_S = 240
MIN_FIGURES = 20
# The fast mode's whole run in the suite (about 80 s on two busy cores), and the full run the committed outputs
# come from (about 3 minutes on two cores): the notebook promises a reader at most four minutes.
FAST_RUN_BUDGET_S = 180
FULL_RUN_BUDGET_S = 240
# The chapters in the order a learner needs them: a word each chapter heading must hold, in this order.
LEARNER_ORDER = ("준비", "토크나이저", "임베딩", "위치 인코딩", "어텐션", "멀티 헤드", "인코더", "마스크", "손실",
                 "학습", "디코딩", "검색", "맥락", "평가", "내 데이터", "부록")
EXECUTION = {}  # seconds the executed fixture's run took


def shown_figures(cell) -> int:
    """Figures a cell shows: pyplot's `plt.show()` or a `chatbot.app.plots` figure passed to `display`."""
    return cell.source.count("plt.show()") + cell.source.count("display(figure)")


def image_count(notebook) -> int:
    return sum("image/png" in output.get("data", {}) for cell in code_cells(notebook) for output in cell.outputs)


@pytest.fixture(scope="module")
def source_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook executed once in fast mode (`notebook_run.run_fast`)."""
    notebook, EXECUTION["seconds"] = run_fast(NOTEBOOK, tmp_path_factory.mktemp("jupyter"), CELL_TIMEOUT_S)
    return notebook


def chapter_headings(notebook) -> list[str]:
    return [line for cell in notebook.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if re.match(r"## \d+\.", line)]


def test_notebook_defines_no_classes_and_imports_the_package(source_notebook):
    source = "\n".join(cell.source for cell in code_cells(source_notebook))
    assert not re.search(r"^\s*class\s+\w+", source, re.M), "the tutorial must import model code, not define it"
    assert not re.search(r"keras\.(layers\.Layer|Model)\s*\)", source)
    for module in ("chatbot.model.transformer", "chatbot.decoding.engine", "chatbot.training.train", "chatbot.data.pairs", "chatbot.app.plots"):
        assert f"from {module} import" in source


def test_notebook_is_committed_with_outputs(source_notebook):
    """Browsing the repository shows the plots without running anything."""
    plots = sum(shown_figures(cell) for cell in code_cells(source_notebook))
    assert plots >= MIN_FIGURES
    assert image_count(source_notebook) >= plots
    assert all(cell.execution_count for cell in code_cells(source_notebook))
    assert not START_UP_NOISE.search(stderr_of(source_notebook))


def test_table_of_contents_lists_every_chapter_and_headings_start_cells(source_notebook):
    markdown = [cell.source for cell in source_notebook.cells if cell.cell_type == "markdown"]
    listed = [int(n) for n in re.findall(r"^\| (\d+) \|", markdown[0], re.M)]
    chapters = [int(n) for text in markdown for n in re.findall(r"^## (\d+)\.", text, re.M)]
    assert chapters == listed == list(range(len(listed)))
    for text in markdown:
        prose = re.sub(r"```.*?```", "", text, flags=re.S)  # a comment line in a code block is no heading
        assert not re.search(r"\n#{1,4} ", prose), f"a heading in the middle of a cell: {text[:60]!r}"


def test_chapters_follow_the_learner_order(source_notebook):
    """Setup, data and tokenizer, embeddings, positions, attention, heads, layers, masks, loss, training, decoding,
    retrieval and copy, the conversation's context, evaluation, your own data; engineering last, in an appendix."""
    headings = chapter_headings(source_notebook)
    assert len(headings) == len(LEARNER_ORDER), headings
    for heading, word in zip(headings, LEARNER_ORDER):
        assert word in heading, f"{heading!r} should be the chapter about {word!r}"


def test_stated_run_time_is_the_recorded_one(source_notebook):
    """The introduction says how long a full run takes; the committed outputs are such a run, timed by the last cell."""
    recorded = text_of(code_cells(source_notebook)[-1])
    match = re.search(r"실행 시간: (\d+)초", recorded)
    assert match and "빠른 모드" not in recorded, "the committed outputs must come from a full (not fast) run"
    seconds = int(match.group(1))
    assert seconds <= FULL_RUN_BUDGET_S
    stated = re.search(r"약 (\d+)분(?: (\d+)초)?", source_notebook.cells[0].source)
    assert stated, "the introduction states the run time"
    stated_seconds = 60 * int(stated.group(1)) + int(stated.group(2) or 0)
    assert abs(stated_seconds - seconds) <= 30, (stated.group(0), seconds)


@pytest.mark.slow  # executes the notebook
def test_notebook_runs_without_errors(executed):
    errors = [output for cell in code_cells(executed) for output in cell.outputs if output.output_type == "error"]
    assert not errors


@pytest.mark.slow  # executes the notebook
def test_notebook_runs_within_the_suites_time(executed):
    assert EXECUTION["seconds"] <= FAST_RUN_BUDGET_S, f"the fast run took {EXECUTION['seconds']:.0f} s"


@pytest.mark.slow  # executes the notebook
def test_every_plot_is_drawn(executed):
    plots = sum(shown_figures(cell) for cell in code_cells(executed))
    assert image_count(executed) >= plots >= MIN_FIGURES


@pytest.mark.slow  # executes the notebook
def test_no_start_up_noise(executed):
    assert not START_UP_NOISE.search(stderr_of(executed))


@pytest.mark.slow  # executes the notebook
def test_training_chat_and_speed_cells_report(executed):
    assert "Epoch 2/2" in text_of(tagged(executed, "training"))
    assert text_of(tagged(executed, "chat")).count("A:") == 5
    assert re.search(r"naive_reply\):\s+[\d.]+ ms", text_of(tagged(executed, "speed")))
    default = text_of(tagged(executed, "default-model"))
    assert "건너뜁니다" in default or "greedy" in default
