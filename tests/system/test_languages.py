"""JavaScript and R kernels (SPEC §10.3 language): everything a Python run
gets, in each language, against the real stack and its sandbox: output and
errors, state, values and main(arguments), timeouts, rich outputs as
artifacts, capture, staged inputs, the file API, sessions, the pool and
preload per language, and test_isolation's attacks from each language.

The kernels: Deno's built-in Jupyter kernel and IRkernel, each run by
codexec's front kernel (launcher/front.py) in the same sandbox. The
quickstart installs both runtimes: a machine without them fails here."""

import base64
import hashlib
import json
import os
import time

import stack
from harness import check, eq, expect_error, metric, new_id, wait_until
from test_files import files_url, get, put
from test_isolation import Bystander
from test_runs import gateway, run, session_kernel

LANGS = ("javascript", "r")

# A 1x1 PNG, as a JavaScript display sends it.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e2217b"
    "b40000000049454e44ae426082")).decode()

# What each language says for the same things.
CODE = {
    "javascript": {
        "hello": 'let x = 6 * 7;\nconsole.log("out", x);\nconsole.error("err");',
        "hello_out": "out 42\n", "hello_err": "err\n",
        "next": "x + 1", "next_value": "43",
        "fail": 'throw new TypeError("bad thing");', "fail_name": "TypeError",
        "main": "async function main(args) {\n"
                "  await new Promise((r) => setTimeout(r, 10));\n"
                "  console.log(\"in main\");\n"
                "  return { got: args, pi: Math.PI, sum: 0.1 + 0.2, none: null };\n}",
        "spin": "while (true) {}",
        "hang": "await new Promise(() => {});",
        "write": 'Deno.writeTextFileSync("made.txt", "made by code\\n");\n'
                 'Deno.writeTextFileSync("note.txt", Deno.readTextFileSync("note.txt") + "more\\n");',
        "read_input": 'console.log(Deno.readTextFileSync("inputs/seed.csv").trim());',
        "rich": f'Deno.jupyter.display({{"image/png": "{PNG}"}}, {{ raw: true }});\n'
                'Deno.jupyter.svg`<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4">'
                '<circle r="2"/></svg>`',
        "print_loop": 'for (let i = 0; i < 3; i++) console.log("line", i);',
        "exit": "Deno.exit(3);",
        "nprocs": 'console.log([...Deno.readDirSync("/proc")].filter((e) => /^\\d+$/.test(e.name)).length);',
    },
    "r": {
        "hello": 'x <- 6 * 7\ncat("out", x, "\\n")\ncat("err\\n", file = stderr())',
        "hello_out": "out 42 \n", "hello_err": "err\n",
        "next": "x + 1", "next_value": "[1] 43",
        "fail": 'stop("bad thing")', "fail_name": "ERROR",
        "main": "main <- function(a, b, c, n, s, d) {\n"
                "  cat(\"in main\\n\")\n"
                "  list(got = list(a = a, b = b, c = c, n = n, s = s, d = d), pi = pi,\n"
                "       sum = 0.1 + 0.2, none = NULL)\n}",
        "spin": "while (TRUE) {}",
        "hang": None,  # (R's loop above already ignores nothing: SIGINT stops it)
        "write": 'writeLines("made by code", "made.txt")\n'
                 'cat("more\\n", file = "note.txt", append = TRUE)',
        "read_input": 'cat(readLines("inputs/seed.csv")[2], "\\n", sep = "")',
        "rich": "plot(1:10)",
        "print_loop": 'for (i in 0:2) cat("line", i, "\\n")',
        "exit": "tools::pskill(Sys.getpid(), tools::SIGKILL)",
        "nprocs": 'cat(length(grep("^[0-9]+$", list.files("/proc"))), "\\n")',
    },
}

ARGS = {"a": None, "b": True, "c": False, "n": 1.5e-300, "s": "\u00e9\u2028\"'\\",
        "d": {"deep": [1, 2.5, "x"]}}


def lrun(ctx, lang, user, cid, code, **extra):
    return run(ctx, user, cid, code, language=lang, **extra)


def test_both_languages_are_offered(ctx):
    """The stack offers JavaScript and R (the quickstart installs their
    runtimes; a machine without them fails here, never skips), and health
    checks their kernelspecs."""
    for lang in LANGS:
        check(stack.language_available(lang), f"{lang}'s runtime is installed on this machine")
        check(lang in ctx.st.languages, f"the stack offers {lang}")
    r = ctx.get("/v1/health")
    eq(r.status, 200, f"health {r!r}")
    status, specs = gateway(ctx, "GET", "/api/kernelspecs")
    for name in stack.LANGUAGE_KERNELS.values():
        check(name in specs["kernelspecs"], f"the gateway offers {name}")
    body = expect_error(ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1",
                                              "language": "cobol"}, key=ctx.key("lang-bad")), 400)
    check("javascript" in body["error"]["message"], f"the message names the languages: {body}")


def test_output_state_values_and_errors(ctx):
    for lang in LANGS:
        c, user, cid = CODE[lang], f"lang-basic-{lang}", new_id()
        r = lrun(ctx, lang, user, cid, c["hello"])
        eq((r["status"], r["stdout_tail"], r["stderr_tail"]), ("ok", c["hello_out"], c["hello_err"]),
           f"{lang}: output {r!r}")
        eq((r["session"]["created"], r["result_present"], r["result"]), (True, False, None),
           f"{lang}: a new session, no value")
        r = lrun(ctx, lang, user, cid, c["next"])
        eq((r["status"], r["result"], r["result_present"], r["session"]["reset"]),
           ("ok", c["next_value"], True, False), f"{lang}: state kept, the value as result {r!r}")
        check(any(x["type"] == "execute_result" and x["data"].get("text/plain") == c["next_value"]
                  for x in r["results"]), f"{lang}: the value in results: {r['results']}")
        r = lrun(ctx, lang, user, cid, c["fail"])
        eq((r["status"], r["error_name"]), ("error", c["fail_name"]), f"{lang}: an error {r!r}")
        check("bad thing" in r["error"], f"{lang}: its value {r['error']!r}")
        check(r["traceback"] and "bad thing" in r["traceback"], f"{lang}: its traceback {r!r}")
        r = lrun(ctx, lang, user, cid, c["print_loop"] + "\n" + c["fail"], output="full")
        eq(r["status"], "error", f"{lang}: output full of a failed run {r!r}")
        check(r["stdout"].count("line") == 3, f"{lang}: stdout whole: {r['stdout']!r}")
        r = lrun(ctx, lang, user, cid, c["next"])
        eq(r["result"], c["next_value"], f"{lang}: an error loses no state")
        s = ctx.get(f"/v1/conversations/{cid}/session", key=ctx.key(user)).json()
        eq(s["language"], lang, f"{lang}: the session says its language")


def test_main_with_arguments(ctx):
    """main(arguments): JavaScript's one object, awaited; R's named
    arguments. Arguments are data (null, true, false, quotes, a line
    separator) and the value comes back with every digit."""
    for lang in LANGS:
        user, cid = f"lang-main-{lang}", new_id()
        r = lrun(ctx, lang, user, cid, CODE[lang]["main"], arguments=ARGS)
        eq(r["status"], "ok", f"{lang}: main ran {r!r}")
        eq(r["result_present"], True, f"{lang}: main was called")
        eq(r["result"], {"got": ARGS, "pi": 3.141592653589793, "sum": 0.30000000000000004,
                         "none": None}, f"{lang}: main's value, exact")
        eq(r["stdout_tail"], "in main\n", f"{lang}: main's own output")
        r = lrun(ctx, lang, user, new_id(), "const y = 1;" if lang == "javascript" else "y <- 1",
                 arguments={})
        eq((r["status"], "main" in (r.get("error") or "")), ("error", True),
           f"{lang}: no main is a clear error {r!r}")
    # RAGFlow's Node shape: main exported, not global
    r = lrun(ctx, "javascript", "lang-main-js", new_id(),
             "module.exports = { main: (args) => args.n * 2 };", arguments={"n": 21})
    eq((r["status"], r["result"]), ("ok", 42), f"module.exports.main {r!r}")


def test_timeouts_interrupt_then_restart(ctx):
    for lang in LANGS:
        c, user, cid = CODE[lang], f"lang-time-{lang}", new_id()
        lrun(ctx, lang, user, cid, c["hello"])
        t0 = time.monotonic()
        r = lrun(ctx, lang, user, cid, c["spin"], timeout=2)
        eq((r["status"], r["error_name"]), ("error", "TimeoutError"), f"{lang}: timed out {r!r}")
        check(time.monotonic() - t0 < 30, f"{lang}: within the grace period")
        r = lrun(ctx, lang, user, cid, c["next"])
        eq((r["status"], r["result"], r["session"]["reset"]), ("ok", c["next_value"], False),
           f"{lang}: the interrupt stopped it and kept the state {r!r}")
    # a promise that never settles can't be interrupted: the kernel is restarted
    user, cid = "lang-time-hang", new_id()
    lrun(ctx, "javascript", user, cid, CODE["javascript"]["hello"])
    r = lrun(ctx, "javascript", user, cid, CODE["javascript"]["hang"], timeout=2)
    eq((r["status"], r["error_name"], r["session"]["reset"]), ("error", "TimeoutError", True),
       f"a hung promise: the kernel restarted, said {r!r}")
    r = lrun(ctx, "javascript", user, cid, "typeof x")
    eq((r["status"], r["session"]["reset"], r["result"]), ("ok", False, '"undefined"'),
       f"the state is gone, as said {r!r}")


def test_rich_outputs_become_artifacts(ctx):
    for lang in LANGS:
        user, cid = f"lang-rich-{lang}", new_id()
        r = lrun(ctx, lang, user, cid, CODE[lang]["rich"])
        eq(r["status"], "ok", f"{lang}: {r!r}")
        kinds = sorted(a["mime_type"] for a in r["artifacts"])
        check("image/png" in kinds, f"{lang}: a PNG artifact: {r['artifacts']}")
        png = [a for a in r["artifacts"] if a["mime_type"] == "image/png"][0]
        got = ctx.get(f"/v1/artifacts/{png['artifact_id']}/content", key=ctx.key(user))
        eq(got.status, 200, f"{lang}: the PNG downloads")
        check(got.body.startswith(b"\x89PNG"), f"{lang}: it is a PNG")
        eq(hashlib.sha256(got.body).hexdigest(), png["sha256"], f"{lang}: its sha256")
        check(any("image/png" in x["data"] for x in r["results"]),
              f"{lang}: the PNG named in results: {r['results']}")
        if lang == "javascript":
            check("image/svg+xml" in kinds, f"an SVG artifact: {kinds}")
            check(any(x["data"].get("image/svg+xml", "").startswith("<svg") for x in r["results"]),
                  f"the SVG inline in results: {r['results']}")


def test_capture_and_the_file_api(ctx):
    for lang in LANGS:
        user, cid = f"lang-files-{lang}", new_id()
        r = ctx.post(f"/v1/conversations/{cid}/session", {"language": lang}, key=ctx.key(user))
        eq((r.status, r.json()["language"]), (201, lang), f"{lang}: a session opened {r!r}")
        put(ctx, user, cid, "note.txt", b"from the api\n")
        r = lrun(ctx, lang, user, cid, CODE[lang]["write"])
        eq(r["status"], "ok", f"{lang}: {r!r}")
        arts = {a["path"]: a for a in r["artifacts"]}
        eq(sorted(arts), ["made.txt", "note.txt"], f"{lang}: the file made and the file changed")
        eq(arts["made.txt"]["sha256"], hashlib.sha256(b"made by code\n").hexdigest(),
           f"{lang}: sha256 computed by the server")
        eq(get(ctx, user, cid, "note.txt").body, b"from the api\nmore\n",
           f"{lang}: the file API reads what the code wrote")
        listing = ctx.get(files_url(cid), key=ctx.key(user)).json()
        eq(sorted(f["path"] for f in listing["files"]), ["made.txt", "note.txt"],
           f"{lang}: the listing")
        r = lrun(ctx, lang, user, cid, CODE[lang]["hello"])
        eq(r["artifacts"], [], f"{lang}: nothing new is captured again")


MANY = {"javascript": 'for (let i = 0; i < 70; i++) Deno.writeTextFileSync(`f${i}.txt`, `${i}`);',
        "r": 'for (i in 0:69) writeLines(as.character(i), sprintf("f%d.txt", i))'}


def test_capture_caps_and_one_round_trip(ctx):
    """Capture's caps are the same in every language (max_captured_files:
    the rest skipped as too_many_files), and a run is one gateway round
    trip, as in Python."""
    for lang in LANGS:
        user, cid = f"lang-caps-{lang}", new_id()
        lrun(ctx, lang, user, cid, CODE[lang]["hello"])
        trips = metric(ctx, "gateway_round_trips")
        r = lrun(ctx, lang, user, cid, CODE[lang]["next"])
        eq((r["status"], metric(ctx, "gateway_round_trips") - trips), ("ok", 1),
           f"{lang}: one round trip for a run")
        r = lrun(ctx, lang, user, cid, MANY[lang])
        eq((r["status"], len(r["artifacts"])), ("ok", 64), f"{lang}: max_captured_files {r!r}")
        reasons = {s["reason"] for s in r.get("skipped", [])}
        eq((len(r["skipped"]), reasons), (6, {"too_many_files"}), f"{lang}: the rest skipped")


def test_inputs_are_staged(ctx):
    """An input artifact arrives at inputs/<name> for a JavaScript and an R
    run as for Python: staged by the front kernel's Python, read by the
    language."""
    for lang in LANGS:
        user = f"lang-inputs-{lang}"
        up = ctx.request("POST", f"/v1/artifacts?conversation_id=lang-in-{lang}&filename=seed.csv",
                         body=b"x,y\n1,2\n", headers={"Content-Type": "application/octet-stream"},
                         key=ctx.key(user))
        eq(up.status, 201, f"{lang}: upload {up!r}")
        r = lrun(ctx, lang, user, f"lang-in-{lang}", CODE[lang]["read_input"],
                 inputs=[up.json()["artifact_id"]])
        eq((r["status"], r["inputs_loaded"]), ("ok", ["inputs/seed.csv"]), f"{lang}: {r!r}")
        eq(r["stdout_tail"], {"javascript": "x,y\n1,2\n", "r": "1,2\n"}[lang],
           f"{lang}: the input's bytes")
        eq(r["artifacts"], [], f"{lang}: inputs/ is never captured")


def test_the_language_is_the_sessions(ctx):
    cid, user = new_id(), "lang-mismatch"
    r = lrun(ctx, "r", user, cid, "1")
    eq(r["status"], "ok", f"{r!r}")
    body = expect_error(ctx.post("/v1/runs", {"conversation_id": cid, "code": "1"},
                                 key=ctx.key(user)), 409, "language_mismatch")
    check("r" in body["error"]["message"], f"the message says the session's language: {body}")
    expect_error(ctx.post("/v1/runs", {"conversation_id": cid, "code": "1",
                                       "language": "javascript"}, key=ctx.key(user)),
                 409, "language_mismatch")
    expect_error(ctx.post(f"/v1/conversations/{cid}/session", {"language": "python"},
                          key=ctx.key(user)), 409, "language_mismatch")
    r = ctx.post(f"/v1/conversations/{cid}/session", {"ttl": 900}, key=ctx.key(user))
    eq((r.status, r.json()["language"]), (200, "r"), f"extended without a language {r!r}")
    listed = ctx.get("/v1/conversations", key=ctx.key(user)).json()["conversations"]
    eq([(c["conversation_id"], c["language"]) for c in listed], [(cid, "r")], "the listing")
    eq(ctx.request("DELETE", f"/v1/conversations/{cid}/session", key=ctx.key(user)).status, 204,
       "closed")
    r = run(ctx, user, cid, "print(1)")
    eq((r["status"], r["session"]["created"]), ("ok", True), "a new session in Python after it")


def test_a_dead_inner_kernel_is_a_restart(ctx):
    """The tenant ends its language's kernel (quit(), Deno.exit): the pair
    restarts, the run says the kernel died, the next one session.reset."""
    for lang in LANGS:
        user, cid = f"lang-exit-{lang}", new_id()
        lrun(ctx, lang, user, cid, CODE[lang]["hello"])
        r = lrun(ctx, lang, user, cid, CODE[lang]["exit"])
        eq((r["status"], r.get("error_name"), r["session"]["reset"]), ("error", "KernelDied", True),
           f"{lang}: the kernel died, said {r!r}")
        probe, gone = {"javascript": ("typeof x", '"undefined"'), "r": ('exists("x")', "[1] FALSE")}[lang]
        r = wait_until(lambda: (lambda x: x if x["status"] == "ok" else None)(
            lrun(ctx, lang, user, cid, probe)), 60, f"{lang}: a working run")
        eq((r["session"]["reset"], r["result"]), (False, gone),
           f"{lang}: works again, the state gone {r!r}")


def test_the_sandbox_ends_with_its_inner_kernel(ctx):
    """The launcher ends the sandbox when the inner kernel ends, whatever
    the front kernel does: here the tenant stops the front first (its own
    watch can't run), then kills R. Never a sandbox left whose processes
    the run's end no longer reaps."""
    user, cid = "lang-stop-front", new_id()
    lrun(ctx, "r", user, cid, CODE["r"]["hello"])
    t0 = time.monotonic()
    r = lrun(ctx, "r", user, cid,
             "front <- as.integer(strsplit(readLines('/proc/self/stat'), ' ')[[1]][4])\n"
             "tools::pskill(front, tools::SIGSTOP)\n"
             "tools::pskill(Sys.getpid(), tools::SIGKILL)", timeout=60)
    eq((r["status"], r.get("error_name"), r["session"]["reset"]), ("error", "KernelDied", True),
       f"the kernel died, said {r!r}")
    check(time.monotonic() - t0 < 30, "at once, not at the run's timeout")
    r = wait_until(lambda: (lambda x: x if x["status"] == "ok" else None)(
        lrun(ctx, "r", user, cid, 'exists("x")')), 60, "a working run")
    eq(r["result"], "[1] FALSE", f"a new pair of kernels {r!r}")


def pool_rows(ctx, name):
    out = ctx.psql(f"SELECT kernel_id FROM prestarted_kernels WHERE ready AND kernel_name = '{name}'")
    return [line.strip() for line in out.splitlines() if line.strip()]


def set_pools(ctx, n, preload=""):
    st = ctx.st
    for lang in LANGS:
        st.conf_extra[f"kernel_pool_size_{lang}"] = str(n)
    st.conf_extra["kernel_preload_r"] = preload
    st.write_config()
    st.kill_pidfile("codexec-fcgi")
    st.start_fcgi()


def test_pool_and_preload_per_language(ctx):
    """kernel_pool_size_javascript and _r keep kernels of each language
    warm; a new conversation's first run takes one; kernel_preload_r has
    loaded its packages (no attaching: the first run sees a clean search
    path)."""
    try:
        set_pools(ctx, 1, "ggplot2")
        pooled = {}
        for lang in LANGS:
            name = stack.LANGUAGE_KERNELS[lang]
            pooled[lang] = wait_until(lambda: pool_rows(ctx, name), 120, f"a pooled {lang} kernel")
        eq(pool_rows(ctx, stack.KERNEL_NAME), [], "Python's pool stays as configured (none)")
        for lang in LANGS:
            user, cid = f"lang-pool-{lang}", new_id()
            code = {"javascript": CODE["javascript"]["hello"],
                    "r": 'cat(isNamespaceLoaded("ggplot2"), "ggplot2" %in% .packages(), "\\n")'}[lang]
            r = lrun(ctx, lang, user, cid, code)
            eq((r["status"], r["session"]["created"]), ("ok", True), f"{lang}: {r!r}")
            check(session_kernel(ctx, user, cid) in pooled[lang], f"{lang}: the pooled kernel")
            if lang == "r":
                eq(r["stdout_tail"], "TRUE FALSE \n", "R: ggplot2 loaded by the pool, not attached")
            wait_until(lambda: pool_rows(ctx, stack.LANGUAGE_KERNELS[lang]), 120,
                       f"the {lang} pool refilled")
    finally:
        set_pools(ctx, 0)
        ctx.admin("pool", "drain")


# --- test_isolation's attacks, from JavaScript and from R ---------------------

NET = {
    "javascript": "const out = [];\nfor (const [h, p] of [[\"127.0.0.1\", %d], [\"1.1.1.1\", 53]]) {\n"
                  "  try { (await Deno.connect({ hostname: h, port: p })).close(); out.push(\"connected\"); }\n"
                  "  catch (e) { out.push(\"denied \" + e.name); }\n}\n"
                  "try { await fetch(\"http://example.com/\"); out.push(\"fetched\"); }"
                  " catch (e) { out.push(\"denied \" + e.name); }\nconsole.log(JSON.stringify(out));",
    "r": "out <- sapply(list(c(\"127.0.0.1\", \"%d\"), c(\"1.1.1.1\", \"53\")), function(hp)\n"
         "  tryCatch({ con <- socketConnection(hp[1], as.integer(hp[2]), timeout = 3); close(con);"
         " \"connected\" },\n"
         "           error = function(e) \"denied\", warning = function(w) \"denied\"))\n"
         "cat(jsonlite::toJSON(out), \"\\n\")",
}

SURFACE = {
    "javascript": "const r = {};\nfor (const p of %s) {\n"
                  "  try { const s = Deno.statSync(p); r[p] = \"seen \" + (s.isDirectory ? \"dir\" : \"file\"); }\n"
                  "  catch (e) { r[p] = e.name; }\n}\n"
                  "for (const p of [\"/usr/cx-test\", \"/etc/cx-test\", \"/cx-test\"]) {\n"
                  "  try { Deno.writeTextFileSync(p, \"x\"); r[\"write \" + p] = \"ok\"; }"
                  " catch (e) { r[\"write \" + p] = e.name; }\n}\nconsole.log(JSON.stringify(r));",
    "r": "r <- list()\nfor (p in %s) r[[p]] <- if (file.exists(p)) \"seen\" else \"absent\"\n"
         "for (p in c(\"/usr/cx-test\", \"/etc/cx-test\", \"/cx-test\"))\n"
         "  r[[paste(\"write\", p)]] <- tryCatch({ writeLines(\"x\", p); \"ok\" },"
         " error = function(e) \"denied\", warning = function(w) \"denied\")\n"
         "cat(jsonlite::toJSON(r, auto_unbox = TRUE), \"\\n\")",
}

FORK = {
    "javascript": "for (let i = 0; i < 5000; i++)\n"
                  "  new Deno.Command(\"sleep\", { args: [\"600\"] }).spawn();",
    "r": "for (i in 1:5000) { rc <- system2(\"sleep\", \"600\", wait = FALSE);"
         " if (rc != 0) stop(\"the process limit\") }",
}

MEMORY = {
    "javascript": "const a = [];\nwhile (true) a.push(new Uint8Array(32 << 20).fill(1));",
    "r": "a <- list()\nrepeat a[[length(a) + 1]] <- runif(4e6)",
}


def last_json(text):
    return json.loads([l for l in text.splitlines() if l.strip().startswith(("[", "{"))][-1])


def test_no_network_from_either_language(ctx):
    for lang in LANGS:
        r = lrun(ctx, lang, f"lang-net-{lang}", new_id(), NET[lang] % ctx.st.gateway_port, timeout=60)
        eq(r["status"], "ok", f"{lang}: {r!r}")
        got = last_json(r["stdout_tail"])
        check(got and all(str(x).startswith("denied") for x in got),
              f"{lang}: no connection leaves the sandbox (the gateway, the internet): {got}")


def test_no_host_files_and_a_read_only_system(ctx):
    st = ctx.st
    paths = [st.conf, st.secret, st.storage, st.pg_data, st.workspaces,
             os.path.join(st.logdir, "codexec.log"), "/etc/shadow", "/etc/nginx"]
    for lang in LANGS:
        # another tenant's file, in its workspace, while it is live
        other = new_id()
        run(ctx, "lang-victim", other, "open('secret.txt', 'w').write('victim-data')")
        listed = paths + ["/workspace/secret.txt"]
        vec = json.dumps(listed) if lang == "javascript" else \
            "c(" + ", ".join(json.dumps(p) for p in listed) + ")"
        r = lrun(ctx, lang, f"lang-fs-{lang}", new_id(), SURFACE[lang] % vec, timeout=60)
        eq(r["status"], "ok", f"{lang}: {r!r}")
        got = last_json(r["stdout_tail"])
        for p in paths + ["/workspace/secret.txt"]:
            check(not str(got[p]).startswith("seen"), f"{lang}: {p} is out of reach: {got[p]}")
        for p in ("/usr/cx-test", "/etc/cx-test", "/cx-test"):
            check(got["write " + p] != "ok", f"{lang}: {p} can't be written: {got}")


def test_fork_bomb_from_either_language(ctx):
    for lang in LANGS:
        user, cid = f"lang-fork-{lang}", new_id()
        with Bystander(ctx, f"fork-{lang}"):
            r = lrun(ctx, lang, user, cid, FORK[lang], timeout=60)
            eq(r["status"], "error", f"{lang}: the process limit stopped it {r!r}")
            # what it left ended with the run: init, the front kernel and its inner kernel
            r = wait_until(lambda: (lambda x: x if x["status"] == "ok" and
                                    int(x["stdout_tail"].split()[0]) <= 3 else None)(
                lrun(ctx, lang, user, cid, CODE[lang]["nprocs"])), 30,
                f"{lang}: no leftover process")
            eq(r["session"]["reset"], False, f"{lang}: the kernel itself lives on")


def test_memory_bomb_from_either_language(ctx):
    for lang in LANGS:
        user, cid = f"lang-mem-{lang}", new_id()
        with Bystander(ctx, f"mem-{lang}"):
            r = lrun(ctx, lang, user, cid, MEMORY[lang], timeout=120)
        eq(r["status"], "error", f"{lang}: {r!r}")
        r = lrun(ctx, lang, user, cid, CODE[lang]["hello"])
        eq((r["status"], r["stdout_tail"]), ("ok", CODE[lang]["hello_out"]),
           f"{lang}: the session works again {r!r}")
