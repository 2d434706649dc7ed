/* Shared helpers for the client-matrix C programs: FNV-1a digest, file lists. */
#ifndef FANSTORE_CLIENTS_COMMON_H
#define FANSTORE_CLIENTS_COMMON_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
    return h;
}
#define FNV0 1469598103934665603ULL

static inline const char *errname(int e) {
    switch (e) {
    case 0: return "OK";
    case ENOENT: return "ENOENT"; case ENOTDIR: return "ENOTDIR"; case EISDIR: return "EISDIR";
    case EROFS: return "EROFS"; case EIO: return "EIO"; case EACCES: return "EACCES";
    case EPERM: return "EPERM"; case EINVAL: return "EINVAL"; case EBADF: return "EBADF";
    case ELOOP: return "ELOOP"; case EEXIST: return "EEXIST"; case ENOTEMPTY: return "ENOTEMPTY";
    case ENODATA: return "ENODATA"; case ENOTSUP: return "ENOTSUP"; case ENXIO: return "ENXIO";
    default: { static char buf[32]; snprintf(buf, sizeof buf, "E%d", e); return buf; }
    }
}

/* Reads a list of relative paths (one a line). Returns count; *out is malloc'd. */
static inline size_t read_list(const char *listfile, char ***out) {
    FILE *f = fopen(listfile, "r");
    if (!f) { perror(listfile); exit(2); }
    size_t cap = 64, n = 0;
    char **v = malloc(cap * sizeof *v);
    char *line = NULL; size_t lcap = 0; ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        if (line[len - 1] == '\n') line[--len] = 0;
        if (!len) continue;
        if (n == cap) { cap *= 2; v = realloc(v, cap * sizeof *v); }
        v[n++] = strdup(line);
    }
    free(line);
    fclose(f);
    *out = v;
    return n;
}

static inline char *join(const char *root, const char *rel) {
    size_t n = strlen(root) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", root, rel);
    return p;
}

static inline int cmpstr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
#endif
