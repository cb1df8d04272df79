import sys

from chatbot.cli import main

sys.exit(main())
