"""The scripted engine now lives in harness/audit/scripted_engine.py (`python -m harness.audit`
drives real agents with it too); the tests import it from here, as they always did."""

from harness.audit.scripted_engine import *  # noqa: F403
from harness.audit.scripted_engine import __all__ as __all__  # noqa: F401
