"""The web UI's control for each decoding option, and its tone choices.

Owns: `CONTROLS`, a Gradio component factory per `GenerationConfig` field (in field order, which the settings
panel and the `/chat` API follow); the labels are the UI's business, the bounds are `GenerationConfig`'s.
Imports Gradio: only `app.py` imports this module.
"""

import dataclasses

import gradio as gr

from chatbot.config import GenerationConfig

TONE_CHOICES = [("지정 안 함", ""), ("일상", "everyday"), ("위로", "sad"), ("설렘", "love")]
DEFAULTS = GenerationConfig()
DECODING_OPTIONS = tuple(field.name for field in dataclasses.fields(GenerationConfig))
CONTROLS = {  # a control per option (its label is the UI's business): name -> factory(default)
    "strategy": lambda d: gr.Radio([("탐욕 (greedy)", "greedy"), ("빔 서치 (beam)", "beam"),
                                    ("샘플링 (sample)", "sample")], value=d, label="디코딩 방식"),
    "max_new_tokens": lambda d: gr.Slider(1, 100, value=d, step=1, label="최대 길이 (토큰)"),
    "num_beams": lambda d: gr.Slider(1, 8, value=d, step=1, label="빔 너비 (빔 서치)"),
    "length_penalty": lambda d: gr.Slider(0.0, 2.0, value=d, step=0.1, label="길이 보정 (빔 서치, 클수록 긴 답)"),
    "agreement": lambda d: gr.Slider(0.0, 10.0, value=d, step=0.5, label="검색 답변과의 일치 가중치 (빔 서치)"),
    "mbr": lambda d: gr.Slider(0.0, 10.0, value=d, step=0.5, label="빔끼리의 합의 가중치 (빔 서치, MBR)"),
    "candidates": lambda d: gr.Slider(0, 16, value=d, step=1, label="함께 견줄 검색 답변 수 (0 = 모델 답만)"),
    "temperature": lambda d: gr.Slider(0.1, 3.0, value=d, step=0.05, label="온도 (샘플링)"),
    "top_k": lambda d: gr.Slider(0, 100, value=d, step=1, label="top-k (0 = 끔)"),
    "top_p": lambda d: gr.Slider(0.05, 1.0, value=d, step=0.05, label="top-p (1 = 끔)"),
    "repetition_penalty": lambda d: gr.Slider(1.0, 2.0, value=d, step=0.05, label="반복 억제"),
    "no_repeat_ngram_size": lambda d: gr.Slider(0, 5, value=d, step=1, label="반복 금지 n-그램 (0 = 끔)"),
    "seed": lambda d: gr.Number(value=-1, precision=0, minimum=-1, label="시드 (-1 = 매번 무작위)"),
}
