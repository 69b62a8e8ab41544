"""The grader's scratch space and toolchain config, fresh at every grading (run by pid 1).

Runs inside the sandbox, imported by grading_reset.py (the standard library only,
Python >= 3.9). Two parts of "the grader's own machinery" (THREAT_MODEL.md) that live in the
sandbox's writable root, so the agent could shape them:

- scratch (/tmp, /var/tmp, /run): emptied, except mount points (the supervisor's and the grader
  Python's read-only dirs, the port relays) and the task's declared outputs. A grader that
  writes to a fixed /tmp path, or a tool that reads a socket, lock or cache there, gets a fresh
  one, not the agent's.
- toolchain config at /, the one ancestor of /tests (local.TOOLCHAIN_HOOKS): a /node_modules
  that a grader's `require` walks up to (issue 29, finding 8), a /package.json whose "type"
  changes how node parses /tests/*.js, a /go.mod, /.cargo/config.toml, /.python-version, /.git,
  /.env ... put back as the image had them (absent, nearly always).

Neither is evidence of tampering: an agent may use /tmp, or run `npm install` in /, honestly.
What was reset is reported (the `reset` list of the answer), and the grade is then fair.
"""

import os

_image = {}  # toolchain path -> its bytes, or "dir" (the image's own dir is left as it is)
_LIMIT = 1 << 20


def _wipe(path):
    """Remove `path` (never following a symlink); dirs made writable first (the agent may have
    locked them). Mount points below it are left alone (they cannot be removed)."""
    st = os.lstat(path)
    if (st.st_mode & 0o170000) != 0o040000:
        os.unlink(path)
        return
    dirs, stack = [], [(path, st.st_dev)]
    while stack:
        d, dev = stack.pop()
        os.chmod(d, 0o700)
        dirs.append(d)
        with os.scandir(d) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.stat(follow_symlinks=False).st_dev == dev:
                        stack.append((entry.path, dev))
                else:
                    os.unlink(entry.path)
    for d in reversed(dirs):
        os.rmdir(d)


def _kept(path, keep):
    """`path` is a declared output, or holds one, or lies inside one."""
    for k in keep:
        k = k.rstrip("/") or "/"
        if path == k or k.startswith(path + "/") or path.startswith(k + "/"):
            return True
    return False


def _mount_points():
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4]
                for code in ("\\040", "\\011", "\\012", "\\134"):
                    point = point.replace(code, chr(int(code[1:], 8)))
                points.append(point)
    except OSError:
        pass
    return points


_image_scratch = set()  # scratch entries the image's build left (a Dockerfile's COPY to /tmp)


def reset_scratch(dirs, keep, record, notes):
    """Empty each of `dirs` (its mode kept) but mount points, declared outputs and what the
    image itself put there (`record`: the reset right after the build takes that as the image's;
    those entries are left as they are, content included)."""
    if record:
        _image_scratch.clear()
        for top in dirs:
            if os.path.isdir(top) and not os.path.islink(top):
                _image_scratch.update(os.path.join(top, n) for n in os.listdir(top))
        return
    mounts = [m for m in _mount_points() if m != "/"]
    for top in dirs:
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        if (st.st_mode & 0o170000) != 0o040000:  # a symlink or file in its place
            os.unlink(top)
            os.mkdir(top, 0o1777 if top.endswith("tmp") else 0o755)
            notes.append(f"{top} was not a dir: made a fresh one")
            continue
        removed = []
        for name in sorted(os.listdir(top)):
            path = os.path.join(top, name)
            entry = os.lstat(path)
            if path in _image_scratch or entry.st_dev != st.st_dev:
                continue  # the image's own, or a mount point (pid 1's code, the relays)
            if _kept(path, keep) or _kept(path, mounts):
                continue  # the task's declared output, or holds a mount
            _wipe(path)
            removed.append(name)
        os.chmod(top, st.st_mode & 0o7777 or 0o755)
        if removed:
            shown = ", ".join(removed[:5])
            notes.append(f"{top}: {len(removed)} entries of the agent's removed ({shown})")


def _state(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    kind = st.st_mode & 0o170000
    if kind == 0o040000:
        return "dir"
    if kind != 0o100000 or st.st_size > _LIMIT:
        return "other"
    with open(path, "rb") as f:
        return f.read()


def reset_toolchain(paths, keep, record, notes):
    """Toolchain config at the ancestors of /tests back to the image's (see module doc)."""
    if record:
        _image.clear()
        for path in paths:
            state = _state(path)
            if state is not None and state != "other":
                _image[path] = state
        return
    for path in paths:
        if _kept(path, keep):
            continue
        image, now = _image.get(path), _state(path)
        if now == image or (image == "dir" and now == "dir"):
            continue
        if now is not None:
            _wipe(path)
        if isinstance(image, bytes):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, image)
            finally:
                os.close(fd)
        elif image == "dir":
            os.mkdir(path, 0o755)  # (its content was the image's; it is lost, and reported)
        notes.append(
            f"{path} (toolchain config the grader would read) put back as the image had it"
        )
