"""What the benchmarks share: the project root on `sys.path` and the default data file.

Scripts run as `python bench/<name>.py`, so this directory is on `sys.path` and `import common` works.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUNDLED_DATA = ROOT / "data" / "korean_chat.csv"
SHARED_DATA = ROOT.parent / "shared" / "data" / "ChatbotData.csv"
# The public ChatbotData set when it sits beside the checkout, else the bundled set.
DEFAULT_DATA = SHARED_DATA if SHARED_DATA.exists() else BUNDLED_DATA
