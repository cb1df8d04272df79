"""What the web app (`app.py`) needs beyond Gradio: its models and background training, a control per option,
the attention figure."""
