/* codexec: one error enum for the whole library. */
#ifndef CX_ERR_H
#define CX_ERR_H

#define CX_MUSTCHECK    __attribute__((warn_unused_result))
#define CX_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* The size of every message buffer that goes with an error: a sentence for
 * the client, never user content beyond ids. */
#define CX_MSG_MAX 256

enum cx_err {
    /* Not failures: what a callback tells the loop that called it, as
     * nginx's NGX_AGAIN and NGX_DONE. The loop acts on them; they never
     * reach a client (the error table has no row for them). */
    CX_AGAIN = -2, /* pause: return to the caller, which calls again */
    CX_DONE = -4,  /* stop: nothing more is of use */
    CX_OK = 0,
    CX_ERR_NOMEM,           /* allocation failed or a buffer hit its cap */
    CX_ERR_INVALID,         /* bad input from a caller or a file */
    CX_ERR_TOO_LARGE,       /* input exceeds a configured limit */
    CX_ERR_NOT_FOUND,       /* no such row, file or route */
    CX_ERR_INPUT_NOT_FOUND, /* a run's input is not the caller's in its conversation */
    CX_ERR_UNAUTHORIZED,
    CX_ERR_FORBIDDEN,
    CX_ERR_EXPIRED,
    CX_ERR_CONFLICT,      /* busy, already exists */
    CX_ERR_QUOTA,         /* a per-user limit (sessions, bytes, artifacts) */
    CX_ERR_CAPACITY,      /* no kernel can be had now: every gateway is full */
    CX_ERR_TOO_MANY_RUNS, /* the user's runs in progress are at their limit */
    CX_ERR_BUSY,          /* every run slot of the process is taken */
    CX_ERR_IO,            /* read/write/fsync on local storage or a stream */
    CX_ERR_DB,            /* PostgreSQL failed */
    CX_ERR_GATEWAY,       /* the Jupyter gateway failed or answered badly */
    CX_ERR_TIMEOUT,
    CX_ERR_PROTOCOL,    /* a peer broke its protocol (WebSocket, Jupyter) */
    CX_ERR_KERNEL_DIED, /* the kernel exited or was restarted during a run */
    CX_ERR_INTERNAL,
    CX_ERR__COUNT
};

/* A static English description; never NULL. */
const char *cx_strerror(enum cx_err err);

#endif
