# codexec files helper: the file API's operations on a conversation's
# workspace, run inside the kernel (a silent request; lib/files.c sends it,
# see docs/internals/files.md). Compiled once per kernel process and kept
# in sys under its source's SHA-256, like the capture helper.
#
# Input: the execute_request's metadata["codexec_file"]:
#   {"op": "write"|"read"|"list"|"delete"|"abort", "path": p, ..., "state": the capture's
#    record, "version": this source's SHA-256, "src": this source}
# and, for "write", the bytes of one chunk as the request's one binary
# buffer. Output: display_data messages of type
# application/vnd.codexec.file+json, each {"ok": true, ...} or
# {"error": "not_found"|"not_a_file"|"no_space"|"changed"|"io", "message": m},
# and, for "read", the file's bytes as the binary buffers of
# {"op": "chunk"} messages.
#
# Every path is walked one segment at a time from the workspace with
# O_NOFOLLOW: a symlink anywhere in it is "not_a_file", never followed.
import datetime
import hashlib
import json
import os
import stat
import sys

MIME = "application/vnd.codexec.file+json"
UPLOAD_PREFIX = ".codexec-up-"
PAGE = 500  # listing entries per message
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code


def walk(root, parts, make):
    """A descriptor of the directory holding the path's last segment."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for i, seg in enumerate(parts[:-1]):
            try:
                nfd = os.open(seg, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise Refused("not_found", "no such file")
                os.mkdir(seg, 0o755, dir_fd=fd)
                nfd = os.open(seg, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (20, 40):  # ENOTDIR, ELOOP: not a directory, a symlink
                    raise
                raise Refused("not_a_file", "/".join(parts[: i + 1]) + " is not a directory")
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def record_scan(ip, state_path, rel, st, sha):
    """The capture's record takes the file as it is: the next run's capture
    does not offer it as the code's (lib/capture_helper.py's record)."""
    key = [st.st_size, st.st_mtime_ns, st.st_ino, sha, "input"]  # kept through a rescan
    c = getattr(sys, "_codexec_scan", None)
    state = None
    if type(c) is tuple and len(c) == 2 and c[0] == state_path and type(c[1]) is dict:
        state = c[1]
    else:
        try:
            with open(state_path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = None
        if type(state) is not dict:
            state = None
    if state is None:
        state = {}  # no scan yet: the first capture offers every other file, not this one
    state[rel] = key
    sys._codexec_scan = (state_path, state)
    try:
        os.makedirs(os.path.dirname(state_path), exist_ok=True)
        tmp = state_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(state))
        os.replace(tmp, state_path)
    except OSError:
        pass


def op_write(ip, m, send):
    parts = m["path"].split("/")
    tmp = UPLOAD_PREFIX + m["tmp"]
    buf = ip.kernel.get_parent("shell").get("buffers") or [b""]
    fd = walk(ip.starting_dir, parts, m["first"])
    try:
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= (os.O_CREAT | os.O_EXCL) if m["first"] else os.O_APPEND
        try:
            f = os.open(tmp, flags, 0o644, dir_fd=fd)
        except FileNotFoundError:
            raise Refused("changed", "the file being written went away")
        try:
            if not m["first"] and not stat.S_ISREG(os.fstat(f).st_mode):
                raise Refused("changed", "the file being written was replaced")
            data = memoryview(buf[0])
            while data:
                n = os.write(f, data)
                data = data[n:]
        finally:
            os.close(f)
        if not m["last"]:
            send({"ok": True})
            return
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise Refused("not_a_file", m["path"] + " exists and is not a regular file")
        except FileNotFoundError:
            pass
        st = os.stat(tmp, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size != m["size"]:
            raise Refused("changed", "the file being written was changed meanwhile")
        os.rename(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        record_scan(ip, m["state"], m["path"], st, m["sha256"])
        send({"ok": True, "size": st.st_size})
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)  # a failed write leaves nothing
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def op_abort(ip, m, send):
    """Removes what a write that failed half-way left."""
    try:
        fd = walk(ip.starting_dir, m["path"].split("/"), False)
    except Refused:
        send({"ok": True})
        return
    try:
        os.unlink(UPLOAD_PREFIX + m["tmp"], dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    send({"ok": True})


def open_regular(ip, m):
    parts = m["path"].split("/")
    fd = walk(ip.starting_dir, parts, False)
    try:
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                        dir_fd=fd)
        except FileNotFoundError:
            raise Refused("not_found", "no such file")
        except OSError as e:
            if e.errno == 40:  # ELOOP: a symlink
                raise Refused("not_a_file", m["path"] + " is a symlink")
            raise
    finally:
        os.close(fd)
    st = os.fstat(f)
    if not stat.S_ISREG(st.st_mode):
        os.close(f)
        raise Refused("not_a_file", m["path"] + " is not a regular file")
    return f, st


def file_sha256(f, st, rel, state_path):
    c = getattr(sys, "_codexec_scan", None)
    if type(c) is tuple and len(c) == 2 and c[0] == state_path and type(c[1]) is dict:
        k = c[1].get(rel)
        if (type(k) is list and len(k) in (4, 5) and k[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]
                and isinstance(k[3], str)):
            return k[3]
    h = hashlib.sha256()
    while True:
        b = os.read(f, 1 << 20)
        if not b:
            break
        h.update(b)
    return h.hexdigest()


def op_read(ip, m, send, send_bytes):
    f, st = open_regular(ip, m)
    try:
        want = m.get("expect")
        if want is not None and want != [st.st_size, st.st_mtime_ns, st.st_ino]:
            raise Refused("changed", "the file changed while it was read")
        if m["first"]:
            sha = file_sha256(f, st, m["path"], m["state"])
            send({"ok": True, "op": "file", "size": st.st_size, "sha256": sha,
                  "expect": [st.st_size, st.st_mtime_ns, st.st_ino]})
        off, left, chunk = int(m["offset"]), int(m["count"]), int(m["chunk"])
        while left > 0:
            b = os.pread(f, min(chunk, left), off)
            if not b:
                break
            send_bytes({"op": "chunk"}, b)
            off += len(b)
            left -= len(b)
        send({"ok": True, "op": "end"})
    finally:
        os.close(f)


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def op_list(ip, m, send):
    rel = m["path"]
    if rel:
        parts = rel.split("/")
        fd = walk(ip.starting_dir, parts + ["x"], False)
    else:
        fd = os.open(ip.starting_dir, DIR_FLAGS)
    limit, budget = int(m["max"]), int(m["max_bytes"])
    files, truncated, used = [], False, 0
    stack = [(fd, rel)]
    try:
        while stack and not truncated:
            d, prefix = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
                for e in entries:
                    if e.name.startswith(UPLOAD_PREFIX):
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        kind = "dir"
                    elif stat.S_ISREG(st.st_mode):
                        kind = "file"
                    else:
                        continue  # a symlink, a FIFO, a socket: not the API's
                    p = prefix + "/" + e.name if prefix else e.name
                    if len(files) >= limit or used + len(p) + 96 > budget:
                        truncated = True
                        break
                    used += len(p) + 96
                    files.append({"path": p, "type": kind,
                                  "size": st.st_size if kind == "file" else 0,
                                  "mtime": iso(st.st_mtime)})
                    if kind == "dir" and m["recursive"]:
                        try:
                            stack.append((os.open(e.name, DIR_FLAGS, dir_fd=d), p))
                        except OSError:
                            pass
            finally:
                os.close(d)
    finally:
        for d, _ in stack:
            os.close(d)
    files.sort(key=lambda x: x["path"])
    # in pages: one message of 10000 entries costs more JSON than the
    # gateway and codexec build from a kernel's message
    for i in range(0, len(files), PAGE):
        send({"op": "page", "files": files[i:i + PAGE]})
    send({"ok": True, "truncated": truncated})


def op_delete(ip, m, send):
    parts = m["path"].split("/")
    fd = walk(ip.starting_dir, parts, False)
    try:
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused("not_found", "no such file")
        if stat.S_ISDIR(st.st_mode):
            if not m["recursive"]:
                raise Refused("not_a_file", m["path"] + " is a directory (add recursive=true)")
            # shutil's fd-based removal: never follows a link inside
            d = os.open(parts[-1], DIR_FLAGS, dir_fd=fd)
            try:
                rmtree_fd(d)
            finally:
                os.close(d)
            os.rmdir(parts[-1], dir_fd=fd)
        else:
            os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)
    send({"ok": True})


def rmtree_fd(d, depth=0):
    """Empties the directory d by descriptors: never follows a link inside."""
    if depth > 256:
        raise Refused("io", "the tree is too deep")
    with os.scandir(d) as it:
        entries = list(it)
    for e in entries:
        st = e.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            c = os.open(e.name, DIR_FLAGS, dir_fd=d)
            try:
                rmtree_fd(c, depth + 1)
            finally:
                os.close(c)
            os.rmdir(e.name, dir_fd=d)
        else:
            os.unlink(e.name, dir_fd=d)


def run(ip):
    m = dict(ip.kernel.get_parent("shell")["metadata"]["codexec_file"])
    # the capture's record (lib/capture_helper.py's state_path)
    if not os.path.isdir(os.path.dirname(m["state"])):
        m["state"] = "/tmp/.codexec/" + os.path.basename(m["state"])
    pub = ip.display_pub
    session, sock = getattr(pub, "session", None), getattr(pub, "pub_socket", None)

    def send(obj):
        pub.publish(data={MIME: obj}, metadata={})

    def send_bytes(obj, b):
        content = {"data": {MIME: obj}, "metadata": {}, "transient": {}}
        session.send(sock, "display_data", content, parent=pub.parent_header, ident=pub.topic,
                     buffers=[b])

    try:
        op = m["op"]
        if op == "write":
            op_write(ip, m, send)
        elif op == "abort":
            op_abort(ip, m, send)
        elif op == "read":
            if session is None or sock is None:
                raise Refused("io", "this kernel can't send binary buffers")
            op_read(ip, m, send, send_bytes)
        elif op == "list":
            op_list(ip, m, send)
        elif op == "delete":
            op_delete(ip, m, send)
        else:
            raise Refused("io", "unknown operation")
    except Refused as e:
        send({"error": e.code, "message": str(e)})
    except OSError as e:
        code = "no_space" if e.errno in (28, 122, 27) else "io"  # ENOSPC, EDQUOT, EFBIG
        send({"error": code, "message": os.strerror(e.errno or 5)})
