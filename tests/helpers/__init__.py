"""Shared test helpers: everything more than one test module (or a bench script) uses.

Test modules import from here, never from each other (tests/test_test_layout.py enforces it):
a helper private to one test file changes for that file's sake and silently changes another's.

    attacks          the tests-rewriting daemon, and a sandbox that grades only once it acted
    capture_client   an agent's calls through the capture proxy: one chat call, an agent loop
    conversations    synthetic chat and Messages histories, one resent body per turn
    dialect_decode   an agent dialect's reply or stream decoded back to content and tool calls
    network          the network blocked in-process, attempts recorded (offline tests)
    policies         a scripted model policy for hello-file (the viewer's browser test, bench)
    prefix_oracle    the brute-force parent of a turn in the rollout graph
    ranks            a script run on N CPU ranks under torchrun (gloo)
    service          a rollout service with the tests' defaults
    sessions         scripted agents (an agent CLI that is a shell script) and one rollout
    tools            the bash tool definitions, in the three shapes the tests offer
    trainer          seeded tiny models, a one-step trainer, a synthetic replay source
    waiting          poll a condition with a deadline (no fixed sleeps)

The scripted engine (a vLLM stand-in whose replies the test writes) is harness.audit's own
(`harness/audit/scripted_engine.py`), since `python -m harness.audit` drives real agents with it.
"""
