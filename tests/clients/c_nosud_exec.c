/* Runs a program as on a kernel without syscall user dispatch: a seccomp
 * filter (no privilege: no_new_privs) makes prctl(PR_SET_SYSCALL_USER_DISPATCH)
 * fail with EINVAL, as kernels before 5.11 answer, then execs argv[1..].
 * usage: c_nosud_exec PROGRAM [ARGS...] */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]); return 2; }
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 59 /* PR_SET_SYSCALL_USER_DISPATCH */, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)) {
        perror("seccomp");
        return 3;
    }
    execvp(argv[1], argv + 1);
    perror("execvp");
    return 127;
}
