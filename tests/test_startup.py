"""Importing TensorFlow for the command line: lean, and without hiding anything for later."""

import subprocess
import sys
from pathlib import Path

import pytest

from chatbot.startup import keras_extras_left_out


def test_modules_left_out_cannot_be_imported_within_the_block_and_can_afterwards(tmp_path, monkeypatch):
    (tmp_path / "optional_extra.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "optional_extra", raising=False)
    json_module = sys.modules["json"]
    with keras_extras_left_out(("optional_extra", "json")):
        with pytest.raises(ImportError):
            import optional_extra  # noqa: F401
        import json
        assert json is json_module  # what was imported before stays as it was
    import optional_extra

    assert optional_extra.VALUE == 1 and sys.modules["json"] is json_module
    monkeypatch.delitem(sys.modules, "optional_extra")


@pytest.mark.slow  # a TensorFlow subprocess
def test_the_lean_import_loads_keras_without_its_extras_which_import_afterwards():
    script = ("import sys\n"
              "from chatbot.startup import KERAS_EXTRAS, import_tensorflow_quietly\n"
              "import_tensorflow_quietly(lean=True)\n"
              "import keras\n"
              "print(sorted(name for name in KERAS_EXTRAS if name in sys.modules))\n"
              "import pandas\n"
              "print(pandas.DataFrame({'q': ['안녕']}).shape, keras.ops.add(1, 2).numpy())\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["[]", "(1, 1) 3"]
