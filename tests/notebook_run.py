"""Reading and running the two notebooks in tests: their code cells and printed text, and one fast run with a
kernel on this interpreter (nothing registered globally)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import pytest

# What TensorFlow and SentencePiece print from C++ at start-up; the notebooks import them quietly.
START_UP_NOISE = re.compile(r"absl::InitializeLog|cuInit|cuda_platform|cudart_stub|oneDNN|rebuild TensorFlow|"
                            r"precompiled_charsmap")


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def tagged(notebook, tag):
    cells = [cell for cell in code_cells(notebook) if tag in cell.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one code cell tagged {tag!r}"
    return cells[0]


def text_of(cell) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"])
    return "".join(parts)


def stderr_of(notebook) -> str:
    return "".join(output.text for cell in code_cells(notebook) for output in cell.outputs
                   if output.output_type == "stream" and output.name == "stderr")


def run_fast(path: Path, jupyter_dir: Path, cell_timeout_s: int):
    """The notebook at `path` executed once in its fast mode (CHATBOT_NOTEBOOK_FAST=1, on the CPU), with its folder
    as the working directory, as a reader opening it in Jupyter would have. A kernel spec of our own, first on
    JUPYTER_PATH (`jupyter_dir`), makes "python3" this interpreter (the venv's ipykernel) even when the user has
    another "python3" kernel installed. Returns the executed notebook and the seconds its run took; a failing cell
    raises CellExecutionError naming it."""
    spec_dir = jupyter_dir / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (test)", "language": "python"}))
    notebook = nbformat.read(path, as_version=4)
    with pytest.MonkeyPatch.context() as patch:  # the kernel process inherits this environment
        patch.setenv("JUPYTER_PATH", str(jupyter_dir))
        patch.setenv("CHATBOT_NOTEBOOK_FAST", "1")
        patch.setenv("CUDA_VISIBLE_DEVICES", "-1")
        patch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        client = nbclient.NotebookClient(notebook, timeout=cell_timeout_s, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}})
        started = time.perf_counter()
        client.execute()
        return notebook, time.perf_counter() - started


def chapter_headings(notebook) -> list[str]:
    return [line for cell in notebook.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if re.match(r"## \d+\. ", line)]


def chapters(notebook) -> list[tuple[int, list]]:
    """(number, cells from its heading up to the next chapter or the glossary) for each numbered chapter."""
    found, current = [], None
    for cell in notebook.cells:
        heading = re.match(r"## (\d+)\. ", cell.source) if cell.cell_type == "markdown" else None
        if heading or (cell.cell_type == "markdown" and cell.source.startswith("## 용어 정리")):
            current = (int(heading.group(1)), [cell]) if heading else None
            if current:
                found.append(current)
        elif current:
            current[1].append(cell)
    return found


def check_glossary(notebook, required) -> None:
    """The notebook ends with its glossary (용어 정리): every term of `required` an entry, each entry once, each saying
    what the term means."""
    glossary = notebook.cells[-1]
    assert glossary.cell_type == "markdown" and glossary.source.startswith("## 용어 정리")
    entries = [line for line in glossary.source.splitlines() if line.startswith("* **")]
    terms = [re.match(r"\* \*\*(.+?)\*\*", line).group(1) for line in entries]
    for term in required:
        assert term in terms, f"the glossary lacks {term}"
    assert len(entries) == len(set(terms)) >= len(required)
    assert all(": " in line for line in entries), "each entry says what the term means"
