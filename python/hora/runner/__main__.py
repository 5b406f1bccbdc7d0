"""``python -m hora.runner`` is the same as ``horarun``."""
import sys

from hora.runner.cli import main

sys.exit(main())
