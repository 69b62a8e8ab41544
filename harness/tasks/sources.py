"""Where tasks come from: a folder, the bundled examples, a Harbor registry dataset, an HF repo.

One spec string names a source (what `--tasks` takes):

    bundled                       harness/tasks/bundled/
    family:train, family:heldout  a split of the generated family (harness/tasks/family.py)
    lookup:train|dev|test         a split of the multi-step lookup family (harness/tasks/lookup.py)
    ./my-tasks  or  /abs/dir      a folder of task dirs (or one task dir)
    registry:terminal-bench@2.0   a Harbor registry dataset, via Harbor's registry client
    terminal-bench@2.0            the same, when no such path exists (org/name@ref too)
    hf:org/repo[@rev][:subdir]    an HF dataset repo of task dirs, via huggingface_hub

Downloads go through the libraries' own clients and caches (Harbor's task cache, the HF hub
cache). Network failures are translated here, once, into TaskSourceUnavailableError naming the
offline fix: download the tasks where there is network and pass the folder.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from harness.tasks.errors import TaskNotFoundError, TaskSourceError, TaskSourceUnavailableError
from harness.tasks.loader import HarborTask, bundled_tasks, load_folder, load_task

__all__ = ["aload_registry", "load_hf", "load_registry", "load_source"]


def _is_network_error(exc: BaseException) -> bool:
    """True when `exc` or anything in its cause chain is a connection-level failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        module = type(current).__module__
        if isinstance(current, (ConnectionError, TimeoutError)) or name in (
            "ConnectError",
            "ConnectTimeout",
            "ReadTimeout",
            "gaierror",
            "NameResolutionError",
            "OfflineModeIsEnabled",
        ):
            return True
        if module.startswith(("httpx", "httpcore", "requests", "urllib3")) and "Connect" in name:
            return True
        current = current.__cause__ or current.__context__
    return False


def _run_sync[T](coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from sync code, even when the caller already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def aload_registry(
    dataset: str,
    *,
    registry_url: str | None = None,
    registry_path: Path | None = None,
    download_dir: Path | None = None,
) -> list[HarborTask]:
    """Download (or reuse from Harbor's cache) a registry dataset `name@version` and load it."""
    from harbor.registry.client.factory import RegistryClientFactory

    where = str(registry_path or registry_url or "the Harbor registry")
    try:
        client = RegistryClientFactory.create(
            registry_url=registry_url, registry_path=registry_path
        )
        items = await client.download_dataset(dataset, output_dir=download_dir)
    except Exception as exc:
        if _is_network_error(exc):
            raise TaskSourceUnavailableError(
                f"could not reach {where} for dataset {dataset!r} ({exc}; the root cause is a "
                "network failure). Offline, download it where there is network "
                f"(`harbor datasets download {dataset} -o DIR`) and pass --tasks DIR."
            ) from exc
        raise TaskSourceError(
            f"{where} could not provide dataset {dataset!r}: {exc}. Check the name and "
            "version (`harbor datasets list`), or pass a local folder with --tasks DIR."
        ) from exc
    if not items:
        raise TaskSourceError(f"dataset {dataset!r} from {where} holds no tasks")
    source = f"registry:{dataset}"
    return [load_task(item.downloaded_path, source=source) for item in items]


def load_registry(dataset: str, **kwargs: Any) -> list[HarborTask]:
    """Sync twin of `aload_registry`."""
    return _run_sync(aload_registry(dataset, **kwargs))


def load_hf(
    repo_id: str,
    *,
    revision: str | None = None,
    subdir: str | None = None,
    cache_dir: Path | None = None,
    offline: bool = False,
) -> list[HarborTask]:
    """Snapshot an HF *dataset* repo of task dirs (huggingface_hub's cache) and load it."""
    from huggingface_hub import snapshot_download

    pretty = f"{repo_id}@{revision}" if revision else repo_id
    try:
        local = snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
        )
    except Exception as exc:
        if type(exc).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or (
            _is_network_error(exc)
        ):
            raise TaskSourceUnavailableError(
                f"could not fetch HF dataset repo {pretty} and it is not in the local HF cache "
                f"({exc}). Offline, download it where there is network "
                f"(`hf download --repo-type dataset {repo_id} --local-dir DIR`) and pass "
                "--tasks DIR; for a private repo set HF_TOKEN."
            ) from exc
        raise TaskSourceError(f"HF dataset repo {pretty} could not be read: {exc}") from exc
    folder = Path(local) / subdir if subdir else Path(local)
    return load_folder(folder, source=f"hf:{pretty}")


def _parse_hf(spec: str) -> tuple[str, str | None, str | None]:
    """'org/repo[@rev][:subdir]' -> (repo_id, revision, subdir)."""
    rest, _, subdir = spec.partition(":")
    repo_id, _, revision = rest.partition("@")
    if repo_id.count("/") != 1:
        raise TaskSourceError(f"hf:{spec}: expected hf:org/repo[@revision][:subdir]")
    return repo_id, revision or None, subdir or None


def load_source(spec: str | Path, **kwargs: Any) -> list[HarborTask]:
    """Load every task a source spec names (see the module docstring for the forms)."""
    if isinstance(spec, Path):
        return load_folder(spec)
    text = spec.strip()
    if text == "bundled":
        return bundled_tasks()
    if text.startswith("family:"):
        from harness.tasks.family import family_tasks

        return family_tasks(text[len("family:"):])
    if text.startswith("lookup:"):
        from harness.tasks.lookup import lookup_tasks

        return lookup_tasks(text[len("lookup:"):])
    if text.startswith("hf:"):
        repo_id, revision, subdir = _parse_hf(text[3:])
        return load_hf(repo_id, revision=revision, subdir=subdir, **kwargs)
    if text.startswith("registry:"):
        return load_registry(text[len("registry:") :], **kwargs)
    path = Path(text).expanduser()
    if path.exists():
        return load_folder(path)
    if "@" in text:  # name@version or org/name@ref: Harbor's registry client parses both
        return load_registry(text, **kwargs)
    raise TaskNotFoundError(
        f"task source {text!r} is neither an existing folder nor a known form: use a folder, "
        "'bundled', 'family:train|heldout', 'lookup:train|dev|test', 'registry:NAME@VERSION' or 'hf:ORG/REPO[@REV][:SUBDIR]'"
    )
