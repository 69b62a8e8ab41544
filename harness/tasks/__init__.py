"""Harbor tasks for Harness: load them (folder, bundled, registry, HF), select a split.

    from harness.tasks import load_tasks
    split = load_tasks("bundled", names=["hello-file", "csv-report"])
    split = load_tasks("registry:terminal-bench@2.0", count=10)
    split = load_tasks("hf:org/harbor-tasks@main", indices=[0, 3])

Each item is a `HarborTask` (name, path, source, instruction); `task.harbor()` gives Harbor's own
`Task` for trials and verifiers. Harbor is imported only when a task is actually loaded.
"""

from harness.tasks.errors import (
    TaskDefinitionError,
    TaskError,
    TaskNotFoundError,
    TaskSelectionError,
    TaskSourceError,
    TaskSourceUnavailableError,
)
from harness.tasks.loader import (
    BUNDLED_DIR,
    HarborTask,
    bundled_tasks,
    load_folder,
    load_task,
    quiet_harbor,
)
from harness.tasks.select import load_tasks, select_tasks
from harness.tasks.sources import aload_registry, load_hf, load_registry, load_source

__all__ = [
    "BUNDLED_DIR",
    "HarborTask",
    "TaskDefinitionError",
    "TaskError",
    "TaskNotFoundError",
    "TaskSelectionError",
    "TaskSourceError",
    "TaskSourceUnavailableError",
    "aload_registry",
    "bundled_tasks",
    "load_folder",
    "load_hf",
    "load_registry",
    "load_source",
    "load_task",
    "load_tasks",
    "quiet_harbor",
    "select_tasks",
]
