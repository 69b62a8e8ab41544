"""Strict mode: before grading, the sandbox's writable root goes back to the image's but the outputs.

Runs inside the sandbox, imported by grading_reset.py (the standard library only,
Python >= 3.9). A task that sets `[metadata] harness_strict = true` (outputs.py) says its
grade depends on its declared outputs alone; everything else the agent changed in the writable
root (a marker file in /app, a config the image's build wrote, a /node_modules) is put back as
the image had it, so a grader that reads state the task never asked for sees the image's.

Why a snapshot in pid 1's memory: the local sandbox's root is one tmpfs (mounts.py), not an
overlay whose upper dir could be dropped, and anything written inside the sandbox is the
agent's to change (it is uid 0 there). pid 1's memory is not (non-dumpable, no ptrace, no
signals). At the reset after the image's build it records every entry of the root's own
filesystem (mounts skipped: /usr, /etc, /proc, /dev and the binds are read-only or fresh) with
the contents of its files, up to _LIMIT bytes in all (a task whose build writes more cannot be
strict: the error says so). At grading, an entry whose (inode, ctime, size, mode) are the
recorded ones is unchanged (a ctime cannot be set back from inside); anything else is removed,
rewritten or recreated. Ownership is not restored (every file is uid 0's in the sandbox).
"""

import os

_LIMIT = 256 << 20  # bytes of file contents a strict snapshot may hold (pid 1's memory)
_snapshot = {}  # path -> (kind, mode, data, ident, mtime_ns); kind "d", "f", "l" or "o"
_recorded = [False]


def _kept(path, keep):
    """`path` is kept, or holds a kept path (walk into it, never remove it)."""
    for k in keep:
        k = k.rstrip("/") or "/"
        if path == k or path.startswith(k + "/"):
            return "inside"
        if k.startswith(path + "/"):
            return "above"
    return None


def _entry(path, st):
    kind = st.st_mode & 0o170000
    ident = (st.st_ino, st.st_ctime_ns, st.st_size, st.st_mode)
    if kind == 0o040000:
        return ("d", st.st_mode & 0o7777, None, ident, st.st_mtime_ns)
    if kind == 0o120000:
        return ("l", 0, os.readlink(path), ident, st.st_mtime_ns)
    if kind == 0o100000:
        return ("f", st.st_mode & 0o7777, None, ident, st.st_mtime_ns)
    return ("o", st.st_mode & 0o7777, None, ident, st.st_mtime_ns)


def _walk(keep, unlocked):
    """(path, lstat, holds a kept path) of every entry on the root's filesystem but what `keep`
    covers, parents first. A locked dir is opened and added to `unlocked` as (path, mode): the
    caller locks it again when done (its children's lstat needs it open until then)."""
    root_dev = os.lstat("/").st_dev
    stack = ["/"]
    while stack:
        d = stack.pop()
        try:
            names = sorted(os.listdir(d))
        except PermissionError:  # a locked dir (pid 1 has no capability to read past its mode)
            mode = os.lstat(d).st_mode & 0o7777
            os.chmod(d, mode | 0o700)
            unlocked.append((d, mode))
            names = sorted(os.listdir(d))
        for name in names:
            path = (d.rstrip("/") or "") + "/" + name
            st = os.lstat(path)
            if st.st_dev != root_dev:
                continue  # a mount point: /usr, /etc, /proc, /dev, the read-only binds
            where = _kept(path, keep)
            if where == "inside":
                continue
            yield path, st, where == "above"
            if (st.st_mode & 0o170000) == 0o040000:
                stack.append(path)


def record(keep, errors):
    """Take the root as it is now as the image's (the reset right after the build)."""
    _snapshot.clear()
    _recorded[0] = False
    unlocked = []
    try:
        _record(keep, unlocked, errors)
    finally:
        for path, mode in reversed(unlocked):
            os.chmod(path, mode)


def _record(keep, unlocked, errors):
    total = 0
    for path, st, _ in _walk(keep, unlocked):
        entry = _entry(path, st)
        if entry[0] == "f":
            total += st.st_size
            if total > _LIMIT:
                _snapshot.clear()
                errors.append(
                    f"strict mode: the image's writable root holds over {_LIMIT >> 20} MiB of "
                    "files, more than pid 1 keeps a copy of; drop harness_strict or shrink the "
                    "build's output"
                )
                return
            try:
                data = _read(path)
            except PermissionError:  # a file the build locked: opened for the copy only
                os.chmod(path, entry[1] | 0o400)
                try:
                    data = _read(path)
                finally:
                    os.chmod(path, entry[1])
                entry = _entry(path, os.lstat(path))  # (its ctime moved with the chmod)
            entry = entry[:2] + (data,) + entry[3:]
        _snapshot[path] = entry
    _recorded[0] = True


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _remove(path):
    st = os.lstat(path)
    if (st.st_mode & 0o170000) != 0o040000:
        os.unlink(path)
        return
    for name in os.listdir(path) if os.access(path, os.R_OK | os.X_OK) else ():
        _remove(os.path.join(path, name))
    if not os.access(path, os.R_OK | os.X_OK | os.W_OK):
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
    os.rmdir(path)


def _make(path, entry):
    kind, mode, data, _, mtime_ns = entry
    if kind == "d":
        os.mkdir(path, 0o700)
        return
    if kind == "l":
        os.symlink(data, path)
        return
    if kind == "f":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.chmod(path, mode)
        os.utime(path, ns=(mtime_ns, mtime_ns))
    # "o" (a fifo or socket the build left): not recreated, reported by the caller


def restore(keep, notes, errors):
    """Everything on the root's filesystem but `keep` back to the recorded image (module doc)."""
    if not _recorded[0]:
        errors.append("strict mode: no image was recorded (the reset after the build had none)")
        return
    changed, removed, recreated = [], [], []
    seen = set()
    unlocked = []
    for path, st, above in list(_walk(keep, unlocked)):
        image = _snapshot.get(path)
        if image is None:
            if not above and os.path.lexists(path):
                _remove(path)
                removed.append(path)
            continue
        seen.add(path)
        now = _entry(path, st)
        if now[0] == image[0] == "d":
            continue  # its mode is set back below, after its content is restored
        if now[0] == image[0] == "l" and now[2] == image[2]:
            continue
        if now[0] == image[0] and now[3] == image[3]:
            continue  # the same inode, never changed since (its ctime says so)
        if above and now[0] == "d":
            continue  # holds an output: left as it is
        _remove(path)
        _make(path, image)
        changed.append(path)
    for path in sorted(_snapshot):  # parents sort before their children
        if path in seen or _kept(path, keep) == "inside" or os.path.lexists(path):
            continue
        parent = os.path.dirname(path)
        if parent != "/" and not os.path.isdir(parent):
            continue  # under something kept that replaced a dir of the image's
        _make(path, _snapshot[path])
        recreated.append(path)
    for path, mode in reversed(unlocked):  # the agent's locked dirs that hold an output
        if path not in _snapshot and os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, mode)
    for path in sorted(_snapshot, reverse=True):
        kind, mode = _snapshot[path][:2]
        if kind != "d" or not os.path.isdir(path) or os.path.islink(path):
            continue
        if _kept(path, keep) != "inside" and (os.lstat(path).st_mode & 0o7777) != mode:
            os.chmod(path, mode)
    for what, paths in (
        ("entries the image did not have removed", removed),
        ("entries put back as the image had them", changed),
        ("entries of the image the agent deleted recreated", recreated),
    ):
        if paths:
            notes.append(f"strict mode: {len(paths)} {what} ({', '.join(paths[:5])})")
