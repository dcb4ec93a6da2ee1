/* A fresh database per test program on the suite's PostgreSQL. */
#ifndef CX_PGTEST_H
#define CX_PGTEST_H

#include <libpq-fe.h>
#include <unistd.h>

#include "tap.h"

static char pgtest_conninfo[1024];
static char pgtest_dbname[64];

static inline int
pgtest_admin(const char *sql)
{
    PGconn *c = PQconnectdb(tap_pg());
    PGresult *r;
    int ok_;

    if (PQstatus(c) != CONNECTION_OK) {
        printf("Bail out! cannot connect to the test PostgreSQL: %s\n", PQerrorMessage(c));
        tap_bail();
    }
    r = PQexec(c, sql);
    ok_ = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok_)
        printf("# %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok_;
}

/* Creates a database for this program; returns its conninfo. */
static inline const char *
pgtest_create(const char *tag)
{
    char sql[256];

    snprintf(pgtest_dbname, sizeof(pgtest_dbname), "cx_%s_%ld", tag, (long)getpid());
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", pgtest_dbname);
    pgtest_admin(sql);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", pgtest_dbname);
    if (!pgtest_admin(sql)) {
        printf("Bail out! cannot create a test database\n");
        tap_bail();
    }
    snprintf(pgtest_conninfo, sizeof(pgtest_conninfo), "%s dbname=%s", tap_pg(), pgtest_dbname);
    return pgtest_conninfo;
}

static inline void
pgtest_drop(void)
{
    char sql[256];

    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", pgtest_dbname);
    pgtest_admin(sql);
}

#endif
