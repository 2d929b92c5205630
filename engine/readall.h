/*
 * readall.h — a whole stream or file read into memory, for the programs (llms and
 * llms-run read prompts, documents and texts this way). It lives in libengine because
 * that is the lowest library every program links; the engine itself reads no file but
 * the model it maps (ARCHITECTURE.md).
 */
#ifndef LLMS_READALL_H
#define LLMS_READALL_H

#include <stddef.h>
#include <stdio.h>

#include "engine/err.h"

/* Reads f to its end into a fresh buffer with a NUL after the last byte read (the caller
 * frees it); *len, when len is not NULL, gets the bytes read (the text may hold NULs).
 * NULL + err on a read error or when memory runs out. */
char *readall_stream(FILE *f, size_t *len, char err[ERR_MAX]);

/* The whole file at path, the same way. NULL + err (the reason alone, without the path)
 * when it cannot be opened or read. */
char *readall_file(const char *path, size_t *len, char err[ERR_MAX]);

#endif
