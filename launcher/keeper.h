/* codexec: the workspace keeper, one per Jupyter server.
 *
 * A conversation's workspace belongs to its session, not to one kernel
 * process: a kernel restart (a timeout, a crash, the memory limit) loses
 * the kernel's memory but not its files. The workspace is a sized tmpfs,
 * as it always was, but mounted in the keeper's mount namespace (a user
 * and mount namespace of the gateway's user, no privilege needed) rather
 * than in the sandbox's own, so it outlives the sandbox: each launch of a
 * kernel enters the keeper's namespaces before it runs bwrap, whose new
 * mount namespace is a copy of the keeper's, and binds the kernel's
 * workspace at /workspace.
 *
 * The first launcher that finds no keeper starts it (under a lock in the
 * runtime directory). Each launcher holds a connection to it for its
 * kernel's life, naming the kernel (its connection file's base name) and
 * the workspace's size. A workspace nobody holds whose connection file is
 * gone (Jupyter removes it when the kernel is shut down, not when it is
 * restarted) is unmounted by the keeper's sweep. The keeper ends with the
 * Jupyter server (a pidfd), taking every workspace with it.
 *
 * Nothing on the host opens a file of a workspace: the keeper only mounts,
 * unmounts and makes the two directories of a new one. */
#ifndef CX_KEEPER_H
#define CX_KEEPER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sandbox.h"

/* What a launcher holds of the keeper. */
struct cx_keeper {
    int sock;   /* the connection: held while the kernel lives (-1: none) */
    int userns; /* the keeper's user and mount namespaces */
    int mntns;
    int pidfd; /* the keeper's process (a kernel template ends with it) */
    char files[CX_SANDBOX_PATH_MAX + 320]; /* the workspace, in the keeper's mount namespace */
    char state[CX_SANDBOX_PATH_MAX + 320]; /* codexec's state beside it (the capture's record) */
};

/* Connects to the keeper of the runtime directory c->runtime (starting it
 * when there is none: it watches server, the Jupyter server's pid) and
 * holds the workspace of the kernel c->base, mounting it (size bytes)
 * when it is new. On failure msg says why and nothing is held. */
enum cx_err cx_keeper_hold(const struct cx_sandbox_conn *c, uint64_t size, pid_t server,
                           struct cx_keeper *k, char *msg, size_t msglen) CX_MUSTCHECK;

/* Enters the keeper's namespaces (in the child that execs bwrap). */
enum cx_err cx_keeper_enter(const struct cx_keeper *k) CX_MUSTCHECK;

/* Hands the keeper a pidfd of the kernel (one not the launcher's child:
 * forked from the template), which it ends when the launcher's connection
 * ends, however the launcher did. */
enum cx_err cx_keeper_guard(const struct cx_keeper *k, int pidfd) CX_MUSTCHECK;

/* A SOCK_SEQPACKET socket at name in the directory dirfd (a path of any
 * length: through /proc/self/fd), bound and listening or connected; -1 on
 * failure. The keeper's and the template's. */
int cx_keeper_unix_at(int dirfd, const char *name, bool listening);

/* Closes what cx_keeper_hold opened (the kernel ended). */
void cx_keeper_release(struct cx_keeper *k);

#endif
