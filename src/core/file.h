/* The readers' shared pieces (src/core/file.c): a non-blocking regular-file open, dangling
 * symlinks, JSON type names, the atomic writer. Not installed; not API. */
#ifndef MOE_CORE_FILE_H
#define MOE_CORE_FILE_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Human name of a JSON value's type, for messages: "an object", "an array", "a string", "an
 * integer", "a real number", "a boolean", "null"; "absent" for NULL (a missing field). */
const char *moe_io_json_kind(const json_t *v);

/* For messages saying what a field holds: `v`'s kind with its value when it is a scalar --
 * "a string (\"4\")", "an integer (4)", "a real number (6.5)", "a boolean (true)" -- else the
 * kind alone ("an array", "an object", "null", "absent"). Long strings are cut at 60 bytes
 * ("..."). The text lives in a per-thread ring of 8 buffers: valid until 8 more calls on the
 * same thread (enough for one message). */
const char *moe_io_json_found(const json_t *v);

/* A config value as a message shows it after "= ": a string quoted ("\"diagonal\""), a number
 * as written, true / false, else its kind ("an array", "absent", ...). Same ring as above. */
const char *moe_io_json_value(const json_t *v);

/* Open `path` read-only without blocking (O_NONBLOCK, cleared once open: a FIFO never
 * hangs the reader) and fstat it: *fd_out and its size, or MOE_ENOTFOUND (ENOENT; a dangling
 * symlink is named as one, with its target) / MOE_EIO
 * (another errno, named by strerror; or anything but a regular file: "is a FIFO, not a
 * regular file", "is a directory, ..."), the message naming the file. */
moe_status moe_io_open_regular(moe_ctx *ctx, const char *path, int *fd_out, uint64_t *size_out);
/* "a FIFO", "a directory", ... for a st_mode. */
const char *moe_io_file_kind(unsigned mode);
/* 1 when `path` is a symlink whose target (a link in a chain included) does not exist, with
 * the link's own text (readlink, truncated to len - 1 bytes) in target; else 0. */
int moe_io_dangling_target(const char *path, char *target, size_t len);

/* Write the n byte ranges data[i] [len[i]] one after another to `path`, atomically: a
 * temporary file path.tmp.XXXXXX beside it (the same file system), written, chmod 0644,
 * fsynced, closed and renamed over path, then the folder fsynced (best effort). On failure
 * the temporary file is removed and path is untouched: MOE_EIO naming the step (create,
 * write, fchmod, fsync, close, rename), both names and strerror; MOE_ENOMEM. Messages start
 * with label (e.g. "load file ", or "") and path. */
moe_status moe_io_write_atomic(moe_ctx *ctx, const char *label, const char *path, const void *const *data,
                               const size_t *len, size_t n);

#endif
