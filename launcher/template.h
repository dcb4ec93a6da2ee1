/* codexec: Python kernels forked from a template.
 *
 * A Python kernel with the data stack loaded is a process of ~130 MiB, ~60
 * of them its own. The template (template.py, one process per Jupyter
 * server and sandbox settings, in a sandbox of its own) imports the stack
 * and builds the kernel application once; each kernel is a fork of it, so
 * an idle kernel costs the pages it wrote (a few MiB), the rest shared
 * copy-on-write. No tenant code ever runs in the template.
 *
 * Each kernel is still sandboxed as a bwrap'd one is: its own user, mount,
 * pid, network, IPC, UTS and cgroup namespaces (made by the template's
 * child, before anything of the kernel runs), its cgroup (the launcher
 * moves the child into it before the kernel is forked), a root the
 * launcher builds from outside (the system read-only, its own /tmp, /dev,
 * /dev/shm and /proc, the keeper's workspace, its private runtime
 * directory), no capabilities, no new privileges, the same seccomp filter
 * and rlimits. docs/internals/sandbox.md says how, step by step.
 *
 * Where the template can't be had (it does not start, or this host's
 * kernel refuses a step), the launcher starts the kernel with bwrap as
 * before and says why once; it tries the template again a minute later. */
#ifndef CX_TEMPLATE_H
#define CX_TEMPLATE_H

#include <stdbool.h>
#include <sys/types.h>

#include "keeper.h"
#include "sandbox.h"

/* A kernel forked from the template. */
struct cx_template_kernel {
    int pidfd; /* the kernel's (pid 1 of its namespaces; not our child) */
    pid_t pid; /* ... in our pid namespace */
};

/* Whether this launch uses the template: sandbox.conf's template for a
 * Python kernel, unless it failed for this Jupyter server (server)
 * within the last minute. */
bool cx_template_wanted(const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
                        const struct cx_sandbox_conn *c, pid_t server);

/* Forks the kernel of connection file c from the template of its runtime
 * directory (starting the template when there is none: it watches server
 * and the keeper, and ends with either), in cgroup cg, its root built over
 * the keeper's workspace and the private directory; out_fd becomes its
 * stdout and stderr, seccomp_fd (a BPF program) its filter. On success the
 * kernel runs ipykernel on c and tk says which process it is (the keeper
 * ends it when our connection to the keeper ends). On failure nothing of
 * it runs, msg says why, and the failure is remembered for a minute
 * (cx_template_wanted). */
enum cx_err cx_template_start(const struct cx_sandbox_conf *sc, const struct cx_sandbox_conn *c,
                              const char *private_dir, const struct cx_keeper *k,
                              const struct cx_sandbox_cgroup *cg, int seccomp_fd, int out_fd,
                              pid_t server, struct cx_template_kernel *tk, char *msg,
                              size_t msglen) CX_MUSTCHECK;

#endif
