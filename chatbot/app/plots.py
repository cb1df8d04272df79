"""Pictures of a model: the Korean font lookup and the cross-attention heatmap.

Owns: finding a font with Hangul (also one installed after matplotlib built its font cache) and
drawing `Chatbot.attention` results as matplotlib figures, for the web app and the notebook alike.
Figures are plain `matplotlib.figure.Figure`s, never pyplot state, so they are safe in a server thread.
Must not import TensorFlow or load models: it draws the arrays it is given.
"""

from __future__ import annotations

import re
import warnings
from functools import cache
from pathlib import Path

from matplotlib import font_manager
from matplotlib.figure import Figure

KOREAN_FONTS = ("NanumGothic", "NanumBarunGothic", "Noto Sans CJK KR", "Noto Sans KR", "Noto Sans CJK JP",
                "Noto Sans CJK SC", "UnDotum", "Baekmuk Gulim")
KOREAN_FONT_FILES = re.compile(r"nanum|notosanscjk|notoserifcjk|notosanskr|undotum|baekmuk", re.IGNORECASE)


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


def font_family() -> list[str]:
    """The families to draw with: the Korean font first when there is one; DejaVu for the rest (▁ and such)."""
    font = korean_font()
    return [font, "DejaVu Sans"] if font else ["DejaVu Sans"]


def _one_based(value: int, count: int) -> int:
    return min(max(int(value), 1), count) - 1


def attention_figure(result: dict, layer: int | None = None, head: int | None = None) -> Figure:
    """Heatmaps of cross-attention (reply tokens × question tokens) from `Chatbot.attention`.

    `layer` and `head` are 1-based; None means all of them: `(None, None)` is the grid of every layer
    and head, `(layer, None)` one row of that layer's heads, `(layer, head)` a single panel.
    """
    weights = result["weights"]  # (layers, heads, reply, question)
    num_layers, num_heads = weights.shape[:2]
    layers = range(num_layers) if layer is None else [_one_based(layer, num_layers)]
    heads = range(num_heads) if head is None else [_one_based(head, num_heads)]
    cells = [(l, h) for l in layers for h in heads]
    rows, cols = len(layers), len(heads)
    question, reply = result["question_tokens"], result["reply_tokens"]
    cell_w, cell_h = max(3.0, 0.45 * len(question) + 1.5), max(2.5, 0.35 * len(reply) + 1.2)
    figure = Figure(figsize=(min(cell_w * cols, 24), min(cell_h * rows, 30)), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    family = font_family()
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


def draw(figure: Figure) -> Figure:
    """Draw `figure` once now with missing-glyph warnings silenced (no Korean font: boxes instead of
    a crash or a log full of warnings), and return it, ready to show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Gg]lyph.*missing.*")
        warnings.filterwarnings("ignore", message=".*findfont.*")
        figure.canvas.draw()
    return figure
