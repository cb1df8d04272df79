"""Decoding: a request checked once, then one compiled function per plan from the texts to the strings users read
(`chatbot.decoding.chatbot.Chatbot` is the front door)."""
