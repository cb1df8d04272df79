"""The command line: `python -m chatbot {train,chat,eval,export,download}`."""
