"""Importing this registers the `korean_chatbot_data` TFDS builder."""

from chatbot.data.datasets.korean_chatbot_data.korean_chatbot_data_dataset_builder import KoreanChatbotData

__all__ = ["KoreanChatbotData"]
