"""`python -m harness.audit TASKS`: which tasks pay reward for a wrong answer, and to which attack.

The attack library (attacks.py) is played by a scripted policy (scripted_engine.py) through a real
agent in the real sandbox against every task (run.py); __main__.py is the command.
"""

from harness.audit.attacks import ATTACKS, Attack
from harness.audit.run import AuditResult, audit_tasks, grader_notes

__all__ = ["ATTACKS", "Attack", "AuditResult", "audit_tasks", "grader_notes"]
