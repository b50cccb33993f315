/* What every reader of a file named by the user shares (src/io's checkpoint readers, the
 * layer's tuning files): opening without blocking and refusing anything but a regular file,
 * naming a dangling symlink, and the names of JSON value types for messages. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *moe_io_json_kind(const json_t *v)
{
    if (!v)
        return "absent";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* The per-thread ring of message buffers of moe_io_json_found / moe_io_json_value. */
static char *json_msg_buf(void)
{
    static _Thread_local char ring[8][112];
    static _Thread_local unsigned next;
    return ring[next++ % 8];
}

/* `v`'s scalar value into b (96 bytes): strings quoted and cut at 60 bytes. */
static void json_scalar(char *b, const json_t *v)
{
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        const size_t n = strlen(t);
        snprintf(b, 96, "\"%.60s%s\"", t, n > 60 ? "..." : "");
    } else if (json_is_integer(v)) {
        snprintf(b, 96, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        snprintf(b, 96, "%.17g", json_real_value(v));
    } else if (json_is_boolean(v)) {
        snprintf(b, 96, "%s", json_is_true(v) ? "true" : "false");
    } else {
        snprintf(b, 96, "%s", moe_io_json_kind(v));
    }
}

const char *moe_io_json_found(const json_t *v)
{
    char *b = json_msg_buf();
    if (!v || json_is_object(v) || json_is_array(v) || json_is_null(v)) {
        snprintf(b, 96, "%s", moe_io_json_kind(v));
        return b;
    }
    char val[96];
    json_scalar(val, v);
    snprintf(b, 112, "%s (%.80s)", moe_io_json_kind(v), val);
    return b;
}

const char *moe_io_json_value(const json_t *v)
{
    char *b = json_msg_buf();
    json_scalar(b, v);
    return b;
}

int moe_io_dangling_target(const char *path, char *target, size_t len)
{
    struct stat sb;
    if (len == 0 || lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || stat(path, &sb) == 0 || errno != ENOENT)
        return 0;
    ssize_t n = readlink(path, target, len - 1);
    if (n < 0)
        return 0;
    target[n] = '\0';
    return 1;
}

const char *moe_io_file_kind(unsigned mode)
{
    const mode_t m = (mode_t)mode;
    return S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket"
         : "a special file";
}

moe_status moe_io_open_regular(moe_ctx *ctx, const char *path, int *fd_out, uint64_t *size_out)
{
    *fd_out = -1;
    *size_out = 0;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer (forever) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        char target[PATH_MAX];
        if (e == ENOENT && moe_io_dangling_target(path, target, sizeof target))
            return moe_set_error(ctx, MOE_ENOTFOUND, "%s: is a dangling symlink to '%s', which does not exist", path,
                                 target);
        return moe_set_error(ctx, e == ENOENT ? MOE_ENOTFOUND : MOE_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: is %s, not a regular file", path, moe_io_file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    *fd_out = fd;
    *size_out = (uint64_t)sb.st_size;
    return MOE_OK;
}

/* write(2) all of buf, retrying on short writes and EINTR. Returns 0 or an errno value. */
static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (w == 0)
            return EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync the folder holding `path` so the rename is durable. Best effort. */
static void fsync_parent_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir)
        return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash) {
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

moe_status moe_io_write_atomic(moe_ctx *ctx, const char *label, const char *path, const void *const *data,
                               const size_t *len, size_t n)
{
    if (!path[0])
        return moe_set_error(ctx, MOE_EINVAL, "%s: the output path is empty", label[0] ? label : "write");
    /* An existing FIFO, device or folder at path is refused, not replaced by the rename */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return moe_set_error(ctx, MOE_EIO, "%s%s: is %s, not a regular file: not replaced", label, path,
                             moe_io_file_kind(sb.st_mode));
    /* Temporary file beside `path`: same file system, so rename() is atomic. */
    const size_t tmp_len = strlen(path) + sizeof ".tmp.XXXXXX";
    char *tmp = malloc(tmp_len); /* [tmp_len] the temporary file's name */
    if (!tmp)
        return moe_set_error(ctx, MOE_ENOMEM, "%s%s: out of memory", label, path);
    snprintf(tmp, tmp_len, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        const int e = errno;
        moe_status st = e == ENOENT ? moe_set_error(ctx, MOE_EIO,
                                                    "%s%s: cannot be written: its folder does not exist (temporary "
                                                    "file %s: %s)",
                                                    label, path, tmp, strerror(e))
                                    : moe_set_error(ctx, MOE_EIO, "%s%s: cannot create temporary file %s: %s", label,
                                                    path, tmp, strerror(e));
        free(tmp);
        return st;
    }
    int err = 0;
    for (size_t i = 0; i < n && !err; i++)
        err = write_all(fd, data[i], len[i]);
    const char *what = "write";
    if (!err && fchmod(fd, 0644) != 0) {
        err = errno;
        what = "fchmod";
    }
    if (!err && fsync(fd) != 0) {
        err = errno;
        what = "fsync";
    }
    if (close(fd) != 0 && !err) {
        err = errno;
        what = "close";
    }
    if (!err && rename(tmp, path) != 0) {
        err = errno;
        what = "rename";
    }
    moe_status st = MOE_OK;
    if (err) {
        unlink(tmp);
        st = moe_set_error(ctx, MOE_EIO, "%s%s: %s of temporary file %s failed: %s", label, path, what, tmp,
                           strerror(err));
    } else {
        fsync_parent_dir(path);
    }
    free(tmp);
    return st;
}
