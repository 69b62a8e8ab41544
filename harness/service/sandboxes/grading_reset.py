"""The grading reset's file work: grading dirs, the image's symlinks and hook files (run by pid 1).

Runs inside the sandbox, imported by supervisor.py's `_grading_reset` once pid 1 has killed every
other process (the standard library only, Python >= 3.9; only a grading pays its import, not the
supervisor's start-up). Its own module so that the supervisor (commands, relays, pid 1's loop)
reads in one sitting; the reset's scratch and toolchain parts are in grading_scratch.py, strict
mode's in grading_strict.py. What the reset does and why: THREAT_MODEL.md.
"""

import os

import grading_scratch


def _wipe_tree(top):
    """Remove everything under the real directory `top` (iterative: an agent may nest deep).

    Directories are made writable first: the agent may have left them 0555 or 0000, and we are
    their owner without CAP_DAC_OVERRIDE. Symlinks are removed, never followed.
    """
    dirs = []
    stack = [top]
    while stack:
        d = stack.pop()
        os.chmod(d, 0o700)
        dirs.append(d)
        with os.scandir(d) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for d in reversed(dirs[1:]):  # each dir was listed after its parent: children go first
        os.rmdir(d)


def _reset_path(path, mode, wipe, found):
    """Make `path` a real directory with `mode` (and empty, if `wipe`); note what was there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not _is_dir(st.st_mode):
        kind = f"a symlink to {os.readlink(path)!r}" if _is_link(st.st_mode) else "not a dir"
        found.append(f"{path} was {kind}")
        os.unlink(path)
        st = None
    if st is None:
        os.mkdir(path, mode)
    elif st.st_mode & 0o700 != 0o700:  # locked against its owner: a lock, not a preference
        found.append(f"{path} was locked (mode {st.st_mode & 0o7777:o})")
    if wipe:
        names = os.listdir(path) if os.access(path, os.R_OK | os.X_OK) else ["(unreadable)"]
        if names:
            shown = ", ".join(sorted(names)[:5])
            found.append(f"{path} held {len(names)} entries: {shown}")
            _wipe_tree(path)
    os.chmod(path, mode)


def _is_dir(mode):
    return (mode & 0o170000) == 0o040000


def _is_link(mode):
    return (mode & 0o170000) == 0o120000


_HOOK_LIMIT = 1 << 20  # a grader hook file larger than this is compared by size alone
_image_hooks = {}  # hook path -> its bytes as the image left them (see _reset_hooks)


def _read_hook(path):
    """A hook path's content: bytes for a regular file, None when absent, a str otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if _is_link(st.st_mode):
        return f"a symlink to {os.readlink(path)!r}"
    if _is_dir(st.st_mode):
        return "a directory"
    if (st.st_mode & 0o170000) != 0o100000:
        return "not a regular file"
    if st.st_size > _HOOK_LIMIT:
        return f"a file of {st.st_size} bytes"
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _remove_any(path):
    st = os.lstat(path)
    if _is_dir(st.st_mode):
        _wipe_tree(path)
        os.rmdir(path)
    else:
        os.unlink(path)


def _reset_hooks(paths, record, found):
    """Files the grader's tools read uninvited (pytest's config and conftest.py in an ancestor
    of /tests): back to what the image had. `record` (the reset after the image's build) takes
    that state as the image's; later resets report and undo any difference."""
    if record:
        _image_hooks.clear()
        for path in paths:
            content = _read_hook(path)
            if isinstance(content, bytes):
                _image_hooks[path] = content
        return
    for path in paths:
        content = _read_hook(path)
        image = _image_hooks.get(path)
        if content == image:
            continue
        what = "changed" if image is not None and content is not None else "planted"
        if content is None:
            what = "removed"
        elif not isinstance(content, bytes):
            what = content
        found.append(f"{path} (read by the grader's tools) was {what}")
        if content is not None:
            _remove_any(path)
        if image is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, image)
            finally:
                os.close(fd)


def _reset_link(path, target, found):
    """`path` back to a symlink to `target` (the merged-/usr links: /bin, /lib64, ...).

    They live in the writable root: an agent that replaced /bin with a dir of its own would
    own the grader's `#!/bin/bash`, and /lib64 its dynamic loader."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and _is_link(st.st_mode) and os.readlink(path) == target:
        return
    found.append(f"{path} was not the image's symlink to {target}")
    if st is not None:
        _remove_any(path)
    os.symlink(target, path)


def reset_for_grading(header, killed, survivors):
    """After pid 1 killed every other process (`killed`, `survivors`): grading dirs fresh,
    what was found reported.

    `header["paths"]`: [path, mode, wipe] in order (parents first); `header["links"]`: [path,
    target] symlinks of the image to restore; `header["hooks"]`: files the grader's tools would
    read uninvited, put back as they were at the `header["record"]` reset. Returns a dict:
    killed, survivors (processes still alive at the deadline), found (agent state in or above
    the grading dirs, now removed), errors (what could not be reset), reset (the agent's scratch
    files and toolchain config put back: not evidence, see grading_scratch.py), free_bytes /
    free_inodes of the sandbox's root after the reset.
    """
    found, errors, reset = [], [], []
    if not survivors:  # a survivor could undo the reset: leave the dirs as evidence instead
        for path, target in header.get("links") or ():
            try:
                _reset_link(path, target, found)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
        for path, mode, wipe in header.get("paths") or ():
            try:
                _reset_path(path, int(mode), bool(wipe), found)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
        try:
            _reset_hooks(list(header.get("hooks") or ()), bool(header.get("record")), found)
        except OSError as exc:
            errors.append(f"grader hooks: {exc}")
    # Free space as the agent left it (its scratch files count): a full disk is evidence even
    # when the scratch reset below happens to free it.
    st = os.statvfs("/")
    if not survivors:
        keep = list(header.get("keep") or ())
        record = bool(header.get("record"))
        try:
            grading_scratch.reset_toolchain(
                list(header.get("toolchain") or ()), keep, record, reset
            )
        except OSError as exc:
            errors.append(f"toolchain config: {exc}")
        try:
            grading_scratch.reset_scratch(list(header.get("scratch") or ()), keep, record, reset)
        except OSError as exc:
            errors.append(f"scratch space: {exc}")
        if header.get("strict"):  # the task's harness_strict: all but its outputs (and /logs)
            import grading_strict

            strict_keep = keep + list(header.get("strict_keep") or ())
            try:
                if record:
                    grading_strict.record(strict_keep, errors)
                else:
                    grading_strict.restore(strict_keep, reset, errors)
            except OSError as exc:
                errors.append(f"the image's root (strict mode): {exc}")
    return {
        "killed": killed,
        "survivors": survivors,
        "found": found,
        "errors": errors,
        "reset": reset,
        "free_bytes": st.f_bavail * st.f_frsize,
        "free_inodes": st.f_favail if st.f_files else -1,
    }
