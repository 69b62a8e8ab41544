"""Grading out of the agent's reach on any POSIX Harbor backend, through `exec` alone.

The local sandbox does this in its supervisor (`BwrapSandbox.prepare_grading`: the sandbox's
pid 1 kills its whole pid namespace). Harbor's other backends (docker, e2b, modal, daytona) give
us only `exec` into the running environment, and some of them run their own daemon inside it
(the exec channel itself), which a blanket `kill -9 -1` would take down. So:

    after start:     `process_baseline(env)`: every process alive before the agent ran, each as
                     pid:starttime (the start time makes a recycled pid a different process)
                     and each grader hook file (local.GRADING_HOOKS: pytest's config and
                     conftest.py at /) with its checksum
    before grading:  `reset_for_grading(env, baseline)`: SIGKILL every process not in the
                     baseline until none is left, then make /, /logs, /run real dirs and
                     /tests, /logs/verifier and the grader's HOME fresh empty real dirs, and
                     remove each hook file that differs from the baseline; report what was
                     found, like the local sandbox's `GradingReset`. The Harness session then
                     runs the verifier with local.GRADING_ENV (a fresh HOME, no user site, no
                     git hooks)

What it guarantees is what the exec user may do: as root in a container (the usual Harbor
image), every process the agent started and every file it left is within reach. What it cannot
cover: a process that entered another pid namespace the exec user cannot see into, processes
outside the environment (a docker-compose sidecar), an exec user without the rights the agent
had, or a Windows environment (refused: there is no /proc). Nor the image itself: the agent is
root over it there, so it can change the grader's interpreter, pytest or site-packages in place;
only Harbor's separate-verifier mode (a fresh environment) covers that. The script needs /bin/sh,
/proc, sed, cut, chmod, rm, mkdir, stat, ls and cksum (coreutils or busybox).
"""

from __future__ import annotations

import shlex
from typing import Any

from harness.sandboxes.errors import SandboxExecError
from harness.sandboxes.local import GRADING_HOOKS, GRADING_PATHS, GradingReset

__all__ = ["process_baseline", "reset_for_grading"]

# pid:starttime of each live, non-zombie process but the script's own shell and its helpers.
_PROCS = r"""
procs() {
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    rest=$(sed 's/.*) //' "$d/stat" 2>/dev/null) || continue
    [ -n "$rest" ] || continue
    set -- $rest
    [ "$1" = Z ] && continue          # a zombie cannot act
    [ "$2" = "$$" ] && continue       # our own sed/cut helpers
    shift 19; echo "$p:$1"           # field 22 of stat: start time
  done
}
"""

# hook:path:signature of each GRADING_HOOKS file present (cksum of a regular file).
_HOOKS = r"""
hook_sig() {
  if [ -L "$1" ]; then echo "hook:$1:link"
  elif [ -d "$1" ]; then echo "hook:$1:dir"
  elif [ -e "$1" ]; then set -- "$1" $(cksum < "$1"); echo "hook:$1:$2-$3"
  fi
}
hooks() { for f in $HOOKS; do hook_sig "$f"; done; }
"""

_RESET = r"""
keep=" $KEEP "
# our own ancestors (the backend's exec daemon may spawn a process per command): never killed
p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  rest=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || break
  set -- $rest
  pp=$2; shift 19; keep="$keep$p:$1 "; p=$pp
done
killed=0; i=0
while :; do
  left=""
  for e in $(procs); do
    case "$keep" in *" $e "*) continue;; esac
    kill -9 "${e%%:*}" 2>/dev/null && killed=$((killed + 1))
    left="$left ${e%%:*}"
  done
  [ -z "$left" ] && break
  i=$((i + 1))
  if [ "$i" -ge 200 ]; then for p in $left; do echo "survivor $p"; done; break; fi
  sleep 0.05
done
echo "killed $killed"
fix_dir() {
  if [ -L "$1" ]; then
    echo "found $1 was a symlink to '$(readlink "$1")'"; rm -f "$1"
  elif [ -e "$1" ] && [ ! -d "$1" ]; then
    echo "found $1 was not a dir"; rm -f "$1"
  fi
  if [ -d "$1" ]; then
    m=$(stat -c %a "$1")
    [ $(( (0$m >> 6) & 7 )) -eq 7 ] || echo "found $1 was locked (mode $m)"
    if [ "$3" = 1 ]; then
      chmod u+rwx "$1"
      n=$(ls -A "$1" | wc -l)
      if [ "$n" -gt 0 ]; then
        names=$(ls -A "$1" | sort | head -5 | tr '\n' ',' | sed 's/,$//; s/,/, /g')
        echo "found $1 held $n entries: $names"
        chmod -R u+rwx "$1" && rm -rf "$1"
      fi
    fi
  fi
  mkdir -p "$1" && chmod "$2" "$1" || echo "error $1: could not be reset"
}
fix_hooks() {
  for f in $HOOKS; do
    now=$(hook_sig "$f"); was=""
    for e in $KEEP; do case "$e" in "hook:$f:"*) was=$e;; esac; done
    [ "$now" = "$was" ] && continue
    echo "found $f (read by the grader's tools) was planted, changed or removed"
    rm -rf "$f" || echo "error $f: could not be removed"
  done
}
"""


async def _run(env: Any, script: str, what: str) -> str:
    if str(getattr(env, "os", "linux")).lower().endswith("windows"):
        raise SandboxExecError(f"{what}: not available for a Windows environment (no /proc)")
    result = await env.exec(script, timeout_sec=120)
    if result.return_code != 0:
        raise SandboxExecError(
            f"{what} failed in the environment (exit {result.return_code}): "
            f"{(result.stderr or result.stdout or '')[-500:]}"
        )
    return result.stdout or ""


async def process_baseline(env: Any) -> list[str]:
    """The environment's own processes (pid:starttime), taken before the agent runs."""
    script = f"HOOKS={shlex.quote(' '.join(GRADING_HOOKS))}\n" + _PROCS + _HOOKS + "procs\nhooks\n"
    out = await _run(env, script, "the process baseline")
    return [line for line in out.split() if ":" in line]


async def reset_for_grading(env: Any, baseline: list[str]) -> GradingReset:
    """Kill what the agent started, make the grading dirs fresh; what was found."""
    fixes = "".join(
        f"fix_dir {shlex.quote(path)} {mode:o} {int(wipe)}\n" for path, mode, wipe in GRADING_PATHS
    )
    script = (
        f"KEEP={shlex.quote(' '.join(baseline))}\n"
        + f"HOOKS={shlex.quote(' '.join(GRADING_HOOKS))}\n"
        + _PROCS
        + _HOOKS
        + _RESET
        + fixes
        + "fix_hooks\n"
        + "echo \"free $(stat -f -c '%a %S %d' /)\"\n"
    )
    out = await _run(env, script, "the grading reset")
    killed, survivors, found, errors = 0, [], [], []
    free_bytes = free_inodes = -1
    for line in out.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "killed":
            killed = int(rest)
        elif kind == "survivor":
            survivors.append(rest)
        elif kind == "found":
            found.append(rest)
        elif kind == "error":
            errors.append(rest)
        elif kind == "free":
            blocks, size, inodes = (int(x) for x in rest.split())
            free_bytes, free_inodes = blocks * size, inodes
    return GradingReset(killed, survivors, found, errors, free_bytes, free_inodes)
