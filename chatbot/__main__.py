import sys

from chatbot.cli.main import main

sys.exit(main())
