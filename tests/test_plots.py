"""Attention heatmaps: a panel per layer and head asked for, token labels, no crash without a Korean font."""

import warnings

import numpy as np
import pytest

from chatbot.app import plots

RESULT = {"question_tokens": ["<s>", "안녕", "</s>"], "reply_tokens": ["반가", "워요", "</s>"],
          "weights": np.random.default_rng(0).random((2, 3, 3, 3))}


def titles(figure):
    return [ax.get_title() for ax in figure.axes if ax.get_title()]


def test_grid_row_and_single_panel():
    assert len(titles(plots.attention_figure(RESULT))) == 6
    assert titles(plots.attention_figure(RESULT))[-1] == "층 2 · 헤드 3"
    assert titles(plots.attention_figure(RESULT, layer=2)) == ["층 2 · 헤드 1", "층 2 · 헤드 2", "층 2 · 헤드 3"]
    assert titles(plots.attention_figure(RESULT, layer=9, head=0)) == ["층 2 · 헤드 1"]  # clamped to the model


def test_panels_are_labelled_with_the_tokens():
    (panel,) = [ax for ax in plots.attention_figure(RESULT, layer=2, head=1).axes if ax.get_title()]
    assert [t.get_text() for t in panel.get_xticklabels()] == RESULT["question_tokens"]
    assert [t.get_text() for t in panel.get_yticklabels()] == RESULT["reply_tokens"]


def test_drawing_works_without_a_korean_font(monkeypatch):
    monkeypatch.setattr(plots, "korean_font", lambda: None)
    figure = plots.attention_figure(RESULT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # boxes instead of glyphs: no error, and no warning per glyph
        assert plots.draw(figure) is figure


@pytest.mark.parametrize("font", [None, "NanumGothic"])
def test_font_family_puts_the_korean_font_first(monkeypatch, font):
    monkeypatch.setattr(plots, "korean_font", lambda: font)
    assert plots.font_family()[-1] == "DejaVu Sans" and (plots.font_family()[0] == font or font is None)
