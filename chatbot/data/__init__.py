"""Data: Korean text made clean and checked at the edge (and the same rules in the graph), and Q&A or dialogue CSV
files read into pairs. Imports only `chatbot.config`."""
