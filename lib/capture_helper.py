# codexec capture helper: runs inside the kernel after the user's cell, in a
# private namespace (exec with a fresh dict), so nothing of it is left in the
# user's state and nothing of the user's state is relied on. Embedded into
# libcodexec at build time; see docs/internals/capture.md.
#
# Input: the execute_request's metadata["codexec_capture"]:
#   {"state": "<state file>", "rescan": bool, "max_files": N, "max_bytes": N, "chunk": N,
#    "outputs": [globs] | null, "sha256": of this source, "src": this source}
# The run's epilogue (lib/epilogue.py), a user expression of the run's last
# request, runs it, so it costs no execute of its own (see
# docs/internals/capture.md).
# Output: display_data messages of type application/vnd.codexec.capture+json:
#   {"op": "file", "n": i, "path": p, "size": s}          a changed file begins
#   {"op": "chunk", "n": i}                                its bytes, in order, as the
#                                                          message's one binary buffer
#   ({"op": "chunk", "n": i, "data": "<base64>"} where the kernel can't send buffers)
#   {"op": "end", "n": i, "size": s, "sha256": h}          what was sent
# and, as `done` in its namespace (its repr is this JSON, which the epilogue
# answers with):
#   {"op": "done", "skipped": [...], "scanned": n, "hashed": m}
import base64
import fnmatch
import gc
import hashlib
import json
import os
import stat
import sys

MIME = "application/vnd.codexec.capture+json"
EXCLUDED_DIRS = ("inputs", "tmp", "__pycache__")
EXCLUDED_SUFFIXES = (".tmp", ".lock", ".pyc", ".pyo")  # the globs *.tmp, *.lock, ...
MAX_SCAN = 100000


def state_path(meta):
    """The record's file: /run/codexec in codexec's sandbox (it outlives a
    restart of the kernel), /tmp/.codexec for a kernel without it."""
    p = meta["state"]
    if not os.path.isdir(os.path.dirname(p)):
        p = "/tmp/.codexec/" + os.path.basename(p)
    return p


def main(ip):
    meta = dict(ip.kernel.get_parent("shell")["metadata"]["codexec_capture"])
    meta["state"] = state_path(meta)
    publish = ip.display_pub.publish
    root = ip.starting_dir
    outputs = meta.get("outputs")
    chunk = int(meta["chunk"])

    def send(obj):
        publish(data={MIME: obj}, metadata={})

    pub = ip.display_pub
    session, sock = getattr(pub, "session", None), getattr(pub, "pub_socket", None)

    def send_bytes(obj, b):
        # The bytes as the message's binary buffer (the gateway forwards it
        # in a binary WebSocket frame): not base64, not in the JSON, not
        # under the message's HMAC. The same socket as publish(): in order.
        if session is not None and sock is not None:
            content = {"data": {MIME: obj}, "metadata": {}, "transient": {}}
            session.send(sock, "display_data", content, parent=pub.parent_header,
                         ident=pub.topic, buffers=[b])
        else:
            obj["data"] = base64.b64encode(b).decode()
            send(obj)

    def named(rel):
        return outputs is not None and any(
            fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(os.path.basename(rel), g)
            for g in outputs)

    def wanted(rel, is_dir):
        parts = rel.split("/")
        if parts[0] == "inputs":
            return False  # staged inputs are never captured
        if outputs is not None and not is_dir:
            return named(rel)
        if named(rel):
            return True
        if parts[-1].startswith("."):
            return False
        if is_dir:
            return parts[-1] not in EXCLUDED_DIRS and not (len(parts) == 1 and parts[0] in EXCLUDED_DIRS)
        if any(p.startswith(".") or p in EXCLUDED_DIRS for p in parts[:-1]):
            return False
        return not parts[-1].endswith(EXCLUDED_SUFFIXES)

    # The last scan's record: kept in the kernel process (reading 500
    # files' record back from JSON cost more than scanning them), else
    # from its file (beside the workspace: it outlives a restart).
    prev = None
    c = getattr(sys, "_codexec_scan", None)
    if type(c) is tuple and len(c) == 2 and c[0] == meta["state"] and type(c[1]) is dict:
        prev = c[1]
    else:
        try:
            with open(meta["state"]) as f:
                prev = json.load(f)
        except (OSError, ValueError):
            pass
    # Without a previous scan (a new kernel) every file is offered; codexec
    # keeps no new version of an unchanged one. A rescan trusts only the
    # record's inputs (files the file API wrote, marked "input", never the
    # code's until the code changes them).
    prev = prev if type(prev) is dict else {}
    if meta.get("rescan"):
        prev = {k: v for k, v in prev.items() if type(v) is list and len(v) == 5 and v[4] == "input"}

    # The scan allocates a few objects per file: no collection of the whole
    # kernel's heap (the user's objects) in the middle of it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        state, skipped, changed, scanned, hashed = scan(root, prev, wanted, outputs is None)
    finally:
        if collecting:
            gc.enable()

    changed.sort()
    sent = 0
    for rel, size in changed:
        if size > meta["max_bytes"]:
            skipped.append({"path": rel, "reason": "too_large"})
            continue
        if sent >= meta["max_files"]:
            skipped.append({"path": rel, "reason": "too_many_files"})
            continue
        n = sent
        sent += 1
        send({"op": "file", "n": n, "path": rel, "size": size})
        h = hashlib.sha256()
        total = 0
        try:
            # O_NOFOLLOW: a file swapped for a symlink since the scan is not followed.
            fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise OSError("not a regular file")
                while total <= meta["max_bytes"]:
                    b = f.read(chunk)
                    if not b:
                        break
                    h.update(b)
                    total += len(b)
                    send_bytes({"op": "chunk", "n": n}, b)
        except OSError:
            send({"op": "end", "n": n, "error": "unreadable"})
            state.pop(rel, None)
            continue
        digest = h.hexdigest()
        send({"op": "end", "n": n, "size": total, "sha256": digest})
        kept = state.get(rel)
        if total == size and kept and len(kept) == 4 and kept[3] in (None, digest):
            kept[3] = digest
        else:
            state.pop(rel, None)  # it changed while we read: look again next run

    sys._codexec_scan = (meta["state"], state)
    if state != prev:  # most runs change nothing: no write
        try:
            os.makedirs(os.path.dirname(meta["state"]), exist_ok=True)
            tmp = meta["state"] + ".tmp"
            with open(tmp, "w") as f:
                f.write(json.dumps(state))  # the C encoder; json.dump() is not
            os.replace(tmp, meta["state"])
        except OSError:
            pass
    return Done(json.dumps({"op": "done", "skipped": skipped, "scanned": scanned, "hashed": hashed}))


def scan(root, prev, wanted, plain):
    """The workspace against the last scan's record: the new record, the
    skipped entries, the changed files, how many entries were scanned and
    how many files hashed. plain: no outputs globs, so a file in a
    directory the scan entered is wanted unless a dot-file, of an excluded
    suffix or the top-level "inputs" (what wanted() says then, cheaper)."""
    S_ISDIR, S_ISREG, S_ISLNK = stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK
    prev_get = prev.get
    state, skipped, changed = {}, [], []
    scanned = hashed = 0
    stack = [""]
    while stack and scanned < MAX_SCAN:
        d = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, d) if d else root))
        except OSError:
            continue
        for e in entries:
            name = e.name
            rel = d + "/" + name if d else name
            scanned += 1
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            if S_ISDIR(mode):
                if wanted(rel, True):
                    stack.append(rel)
                continue
            if plain:
                if name[0] == "." or name.endswith(EXCLUDED_SUFFIXES) or rel == "inputs":
                    continue
            elif not wanted(rel, False):
                continue
            if not S_ISREG(mode):
                kind = "symlink" if S_ISLNK(mode) else "not_regular"
                state[rel] = [kind]
                if prev_get(rel) != [kind]:
                    skipped.append({"path": rel, "reason": kind})
                continue
            size = st.st_size
            old = prev_get(rel)
            if (type(old) is list and len(old) in (4, 5) and old[0] == size
                    and old[1] == st.st_mtime_ns and old[2] == st.st_ino):
                state[rel] = old  # unchanged
                continue
            key = [size, st.st_mtime_ns, st.st_ino]
            if not (type(old) is list and len(old) in (4, 5) and isinstance(old[3], str)) or old[0] != size:
                # New, or of another size: it has changed, so it is sent,
                # and hashed once, as it is read for sending (the record
                # keeps that digest).
                state[rel] = key + [None]
                changed.append((rel, size))
                continue
            sha = hash_file(os.path.join(root, rel))
            hashed += 1
            if sha is None:
                continue
            state[rel] = key + [sha]
            if old[3] != sha:
                changed.append((rel, size))
    return state, skipped, changed, scanned, hashed


class Done:
    """The expression's value: IPython formats it as text/plain with repr()."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def hash_file(path):
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
    except OSError:
        return None
    return h.hexdigest()


done = main(get_ipython())  # noqa: F821 (the kernel's builtin)
