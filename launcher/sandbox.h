/* codexec: the kernel sandbox, as codexec-kernel-launcher builds it.
 *
 * The Jupyter server runs the launcher (the sandboxed kernelspec's argv) as
 * the gateway's user, once per kernel start and again at every restart.
 * Everything the previous kernel of that connection file could write is
 * hostile: the launcher never writes, creates or deletes through a path the
 * kernel could have changed. Each launch gets a fresh private directory
 * (mkdtemp, never reused) for the kernel's sockets and its copy of the
 * connection file, a fresh cgroup per controller with the limits of
 * sandbox.conf, and a seccomp filter; then it execs bubblewrap.
 *
 * See docs/internals/sandbox.md for every boundary and limit. */
#ifndef CX_SANDBOX_H
#define CX_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../lib/codexec.h"

#define CX_SANDBOX_PATH_MAX 1024
#define CX_SANDBOX_PORTS    5

/* A sandbox's /dev/pts, its own instance. Terminals are counted host-wide
 * (kernel.pty.max, 4096 by default, 1024 of them kept for the host's own
 * instance): without a max, one kernel could hold every other sandbox's
 * (IPython's `!cmd` takes one) and every container's on the host. */
#define CX_SANDBOX_PTS_OPTIONS "ptmxmode=0666,mode=620,max=16"

/* A kernelspec's language (the launcher's --language): python is
 * ipykernel itself; javascript and r are the front kernel (front.py, an
 * ipykernel) over Deno's kernel or IRkernel, its child in the same sandbox
 * (docs/internals/languages.md). */
enum cx_sandbox_language { CX_SANDBOX_PYTHON, CX_SANDBOX_JAVASCRIPT, CX_SANDBOX_R };

/* "python", "javascript", "r": the language; -1 for another word. */
int cx_sandbox_language_parse(const char *s);

/* sandbox.conf: the limits of one kernel. */
struct cx_sandbox_conf {
    char *python_env; /* "" = /usr/bin/python3; else a venv/prefix bound read-only */
    char *r;          /* R's command (R kernels) */
    char *deno;       /* Deno's binary (JavaScript kernels); bound read-only outside /usr */
    char *cache_dir;  /* read-only caches built at install time ("" = none) */
    char *cgroup;     /* parent cgroup below each controller's hierarchy ("" = none) */
    char *bwrap;      /* bubblewrap's path */
    uint64_t memory;  /* bytes: processes and tmpfs pages together */
    uint64_t max_workspace_bytes;
    uint64_t tmp_bytes, shm_bytes;
    uint64_t address_space, file_size; /* rlimits per process */
    unsigned pids;                     /* processes and threads (cgroup) */
    unsigned processes;                /* RLIMIT_NPROC */
    unsigned open_files;               /* RLIMIT_NOFILE */
    unsigned cpu_percent;              /* CPU time, percent of one core */
    unsigned cpu_weight;               /* share against other kernels, 1-10000 */
    unsigned threads;                  /* OpenBLAS / OpenMP / numexpr threads */
    bool template;                     /* Python kernels forked from a template (template.h) */
    char *template_preload;            /* modules the template imports: "a,b.c" */
};

/* Defaults over which path is read (NULL: defaults only). On failure the
 * struct is cleaned up and errbuf says "path:line: message". */
enum cx_err cx_sandbox_conf_load(struct cx_sandbox_conf *sc, const char *path, char *errbuf,
                                 size_t errlen) CX_MUSTCHECK;
enum cx_err cx_sandbox_conf_parse(struct cx_sandbox_conf *sc, const char *name, const char *text,
                                  char *errbuf, size_t errlen) CX_MUSTCHECK;
void cx_sandbox_conf_cleanup(struct cx_sandbox_conf *sc);

/* What the launcher needs of Jupyter's connection file. */
struct cx_sandbox_conn {
    char path[CX_SANDBOX_PATH_MAX];    /* absolute */
    char runtime[CX_SANDBOX_PATH_MAX]; /* its directory */
    char base[256];                    /* file name without ".json" */
    char ip_name[256];                 /* the ipc endpoints' file-name prefix */
    int ports[CX_SANDBOX_PORTS];
    int nports;
};

/* Reads the connection file (a regular file, never through a symlink):
 * transport must be "ipc" and the endpoints must live in its directory.
 * cwd makes a relative path absolute. */
enum cx_err cx_sandbox_conn_read(const char *path, const char *cwd, struct cx_sandbox_conn *c,
                                 char *msg, size_t msglen) CX_MUSTCHECK;

/* In the runtime directory: removes private directories of earlier
 * launches of this connection file and of kernels whose connection file is
 * gone (without following anything inside), creates a fresh one (0700,
 * "sbx-<base>.XXXXXX", never reused) and writes the kernel's copy of the
 * connection file into it (O_EXCL). private_out receives its path. */
enum cx_err cx_sandbox_runtime_prepare(const struct cx_sandbox_conn *c, char *private_out,
                                       size_t outlen, char *msg, size_t msglen) CX_MUSTCHECK;

/* Makes the runtime directory read-only inside the sandbox whose first
 * process is pid: enters its mount namespace (through the user namespace
 * that owns it), checks that the directory there is the private one
 * (expect: its stat on the host; a reused pid would name another sandbox)
 * and remounts the bind read-only, keeping its other flags; and gives its
 * pty instance CX_SANDBOX_PTS_OPTIONS (bwrap's has no max).
 * Changes the calling process's namespaces: call it in a child that exits. */
struct stat;
enum cx_err cx_sandbox_seal(int pid, const char *runtime, const struct stat *expect, char *msg,
                            size_t msglen) CX_MUSTCHECK;

/* Removes a directory tree made by a kernel: never follows a symlink,
 * restores the owner's permissions on directories the kernel locked, stays
 * on one filesystem, at most 64 levels deep. A missing path is not an
 * error. */
enum cx_err cx_sandbox_remove_tree(int dirfd, const char *name) CX_MUSTCHECK;

/* One kernel's cgroup: a directory per hierarchy holding memory, pids or
 * cpu (one in all for cgroup v2). */
struct cx_sandbox_cgroup {
    char dirs[3][CX_SANDBOX_PATH_MAX + 320];
    bool v2[3];
    unsigned mask[3]; /* bit 0 memory, 1 pids, 2 cpu */
    int n;
};

/* Creates "<cgroup>/k-<name>-XXXXXX" in the hierarchies of the memory, pids
 * and cpu controllers (cgroup v1 mounts, or the v2 mount, where the parent
 * must enable them for its children) and writes the limits; empty
 * leftovers of ended kernels are removed first. With an empty sc->cgroup it
 * does nothing. Fails (closed) when the parent is missing or a limit can't
 * be written; nothing is left behind then. */
enum cx_err cx_sandbox_cgroup_create(const struct cx_sandbox_conf *sc, const char *name,
                                     struct cx_sandbox_cgroup *cg, char *msg,
                                     size_t msglen) CX_MUSTCHECK;
/* Moves the calling process into the cgroup (before exec). */
enum cx_err cx_sandbox_cgroup_join(const struct cx_sandbox_cgroup *cg) CX_MUSTCHECK;
/* Moves process pid (all its threads) into the cgroup. */
enum cx_err cx_sandbox_cgroup_attach(const struct cx_sandbox_cgroup *cg, pid_t pid) CX_MUSTCHECK;
/* Removes the directories once the kernel's processes are gone; on cgroup
 * v2 any process left in them is ended first, all at once (cgroup.kill). */
void cx_sandbox_cgroup_remove(struct cx_sandbox_cgroup *cg);

/* The one child of pid (the kernel, of the sandbox's first process; the
 * inner kernel, of a front kernel), as a pid of the caller's namespace;
 * -1 when there is none or more than one. */
int cx_sandbox_kernel_pid(int init_pid);

/* Ends every process of the sandbox but its init, the kernel and the
 * inner kernel of a front kernel (inner_pid; -1: none): the run's
 * end, done from outside, so no code in the kernel can keep its children
 * past it. The processes come from the kernel's cgroup when it has one
 * (cg may be NULL), else from the init's descendants; each is signalled
 * through a pidfd after checking it is in the sandbox's pid namespace, so
 * a pid reused meanwhile is never hit. Rounds until none is left (a fork
 * bomb), at most 64; on cgroup v2 they run with the cgroup frozen, so the
 * first round sees every process. *killed counts the processes signalled.
 * CX_ERR_IO when the cgroup could not be thawed again: the sandbox is
 * then ended (cgroup.kill) rather than left frozen. */
enum cx_err cx_sandbox_reap(const struct cx_sandbox_cgroup *cg, int init_pid, int kernel_pid,
                            int inner_pid, int *killed) CX_MUSTCHECK;

/* A file descriptor holding the seccomp filter as a BPF program, for
 * bwrap --seccomp (not close-on-exec): namespace creation, mount, ptrace,
 * bpf, perf_event_open, keyctl, userfaultfd, io_uring, kernel modules,
 * kexec and the like fail with EPERM; other architectures' system calls
 * kill the process. */
enum cx_err cx_sandbox_seccomp_fd(int *fd_out, char *msg, size_t msglen) CX_MUSTCHECK;
/* The same for the kernel template's own sandbox, but unshare allowed
 * (its child makes each kernel's namespaces; template.h). */
enum cx_err cx_sandbox_template_seccomp_fd(int *fd_out, char *msg, size_t msglen) CX_MUSTCHECK;

/* The bwrap command line (NULL-terminated; cx_sandbox_argv_free) for a
 * kernel of the language. A descriptor < 0 leaves its option out.
 * workspace and state: the keeper's directories (keeper.h), bound at
 * /workspace and /run/codexec; NULL: a tmpfs of the sandbox's own at
 * /workspace. */
enum cx_err cx_sandbox_argv(const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
                            const struct cx_sandbox_conn *c, const char *private_dir,
                            const char *workspace, const char *state, int seccomp_fd, int info_fd,
                            char ***argv_out) CX_MUSTCHECK;
void cx_sandbox_argv_free(char **argv);

/* The kernel template's bwrap command line (template.h): fds are the
 * descriptors it inherits (listening socket, the Jupyter server's and the
 * keeper's pidfds, the ready pipe), seccomp_fd its own filter
 * (cx_sandbox_template_seccomp_fd). */
enum cx_err cx_sandbox_template_argv(const struct cx_sandbox_conf *sc, int seccomp_fd,
                                     const int fds[4], char ***argv_out) CX_MUSTCHECK;

/* The files and directories of /etc a kernel sees (NULL-terminated). */
const char *const *cx_sandbox_etc_files(void);

#endif
